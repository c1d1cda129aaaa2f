"""The exporter: a drained output directory converted to the shapes training and batch tools
read (conversations, OpenAI Batch output, Parquet, pre-tokenized rows), from the files alone:
it never needs Redis, so a run can be exported again at any time, long after its keys are
purged, and the drainer stays the one writer of the output files."""

FORMATS = ("conversations", "openai-batch", "parquet", "tokens")
