"""A run's state in Redis (a cache of progress; the output files are the truth): its keys, its
manifest, the bitmaps of its slots, and when it is complete, retried or purged."""
