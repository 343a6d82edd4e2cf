"""The benchmarks (docs/design.md, "Benchmarks"): one folder per question, each run from the
repository root as ``python -m bench.NAME [--quick]`` and printing one JSON line per result.

``bench.common`` holds what several benchmarks share (result lines, child processes, memory
counters); everything else lives in the folder of the one benchmark that uses it.
"""
