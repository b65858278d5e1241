"""What the benchmarks (`benchmarks/`, run from a clone) share: their flags and the command line they record
(`bench_args`), the finished corpus a benchmark reads (`bench_corpus`), and the machine they ran on and where their
figures go (`machine_info`). No stage imports it: it is the engine's top layer, for the room above the engine."""
