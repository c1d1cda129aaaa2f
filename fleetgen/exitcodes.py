"""Exit codes every fleetgen command uses, so scripts can tell what went wrong."""

OK = 0
INCOMPLETE = 1  # the command ran, but the run is not complete (or has failures, for demo)
USAGE = 2  # argparse's own code for bad flags
CONFIG = 3  # a user mistake: missing file, bad setting, mismatched resume
UNAVAILABLE = 4  # Redis or the engine cannot be reached
DISK_FULL = 5  # a disk the run writes to is full (or a file hit `ulimit -f`): free space, rerun
BUG = 70  # an unexpected exception (EX_SOFTWARE); logged with its traceback
INTERRUPTED = 130
CLOSED_PIPE = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as for any tool
