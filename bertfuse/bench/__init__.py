"""GPU benchmarks behind `bertfuse bench`, outside the runtime they measure.

    workloads (names) -> timing, models (skeleton -> raw/ORT/bertfuse models, CUDA check)
    -> padded (ORT raw / ORT optimizer / bertfuse runtime), packed (padded vs packed)
    -> command (the subcommand's options and run)

The scripts in benchmarks/ import their helpers from here.
"""
