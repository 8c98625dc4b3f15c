"""scripts/mk-trace's library: the trace file format (fmt), checks and summary (analysis),
Perfetto JSON (perfetto), the PNG timeline (png), hang reports (hang) and the synthetic
AllGather+GEMM trace (synth). Standard library only, except png (matplotlib)."""
