"""Workers: the Celery app (workers.celery), the generate task, the engine client, the stream
sink and the drainer. `celery -A workers worker ...` finds the app in workers/celery.py."""
