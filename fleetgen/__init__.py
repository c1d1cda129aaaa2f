"""fleetgen: exact-budget, exactly-once completion generation on a fleet of SGLang servers."""

import os

# transformers announces at import that PyTorch is absent; fleetgen only needs its
# tokenizers, and a user's one-line error must stay one line.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

__version__ = "0.1.0"
