"""The queue's wire and its Redis: the contract between producer, workers and drainer (names,
message fields), the task message as it lies in Redis, kombu's transport and the Celery
configuration, Redis connections, Valkey's clock, the workers' heartbeats and a Redis's end."""
