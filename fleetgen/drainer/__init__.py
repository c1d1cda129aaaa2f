"""The drainer (`fleetgen drain`): the only writer of a run's output directory, from the run's
stream to whole JSONL lines, each outcome once. Its own process and its own role: the stream
consumer (stream.py), the file store and its tally (store.py), the run's bookkeeping in Redis
(bookkeeping.py), the loop that ties them together and rides out Redis outages (loop.py), and
the speculative acceptance of its records (acceptance.py, pure; the report reads it too)."""

from fleetgen.drainer.loop import Drainer
from fleetgen.drainer.store import FileStore, Tally, load_file

__all__ = ["Drainer", "FileStore", "Tally", "load_file"]
