"""Floor 6, the top: the local fleet that `fleetgen demo`, the tests and the benchmarks run
(embedded Valkey, simulators, workers, Flower, child processes)."""
