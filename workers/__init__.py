"""Workers: the Celery app (workers.celery), the generate task, the engine client and the stream
sink (the drainer is a role of its own: fleetgen/drainer). `celery -A workers worker ...` finds
the app in workers/celery.py."""
