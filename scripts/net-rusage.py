"""CPU cost of one all_reduce iteration on the forced network path through our plugin (its
default endpoints per comm, and 1) and through NCCL's Socket transport: user and system CPU time and
context switches per iteration, summed over both ranks' processes (getrusage of the
children), beside the harness's own line. usage: python3 scripts/net-rusage.py SIZE...
(e.g. 128K 512K 8M; MK_BUILD names the build, default build)."""
import os, resource, subprocess, sys
B = os.environ.get("MK_BUILD", "build")
base = dict(os.environ, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_NVLS_ENABLE="0", NCCL_TUNER_PLUGIN="none")
nets = {"mk": {"NCCL_NET_PLUGIN": f"{B}/libnccl-net-mk.so", "NCCL_NET": "mk"},
        "mk_s1": {"NCCL_NET_PLUGIN": f"{B}/libnccl-net-mk.so", "NCCL_NET": "mk", "NCCL_MK_OFI_STREAMS": "1"},
        "socket": {"NCCL_NET_PLUGIN": "none", "NCCL_NET": "Socket"}}
for size in sys.argv[1:]:
    for name, env in nets.items():
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([f"{B}/test/perf/coll/all_reduce_perf", "-p", "2", "-g", "1", "-H", "-b", size, "-e", size,
                              "-n", "400", "-w", "20", "-c", "0"], env=dict(base, **env), capture_output=True, text=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        row = [l for l in out.stdout.splitlines() if l.strip() and l.split()[0].isdigit()]
        it = 2 * 420  # out-of-place and in-place
        print(f"{name:7s} {size:>6s} user {1e6*(r1.ru_utime-r0.ru_utime)/it:8.1f} us/it sys {1e6*(r1.ru_stime-r0.ru_stime)/it:8.1f} us/it "
              f"vcsw {(r1.ru_nvcsw-r0.ru_nvcsw)/it:7.1f}/it ivcsw {(r1.ru_nivcsw-r0.ru_nivcsw)/it:6.1f}/it | {row[-1] if row else out.stderr[-200:]}")
