"""The output records: what a result, failure or rejection holds (its answer, reasoning,
log-probabilities, schema verdict), and the output directory they are written to."""
