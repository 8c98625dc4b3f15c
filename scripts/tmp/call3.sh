#!/usr/bin/env bash
# session 32 call 3: non-causal ring backward: NVLink burst hypothesis (local-store diag) and the first-wave stagger
set -u
tar xzf build-pack/b.tgz
B=build-dev
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L=$OUT/ab; mkdir -p $L
for t in small large graph absent_peer; do
  timeout 120 $B/test/gpu/test_ring_attn_bwd $t > $L/rbwd_$t.log 2>&1; echo "test_ring_attn_bwd $t rc=$?"
done
run() { # name env... binary
  local n=$1; shift
  timeout 120 env "$@" -b -n 5 -w 1 -c 1 > $L/$n.log 2>&1; echo "$n rc=$? $(grep -A 1 '^#  B' $L/$n.log | tail -1)"
}
for r in 1 2; do
  run stagger_$r $B/test/perf/fused/ring_attn_perf
  run none_$r $B/ab/47bb424/ring_attn_perf
  run local_$r MK_DIAG_LOCAL=1 $B/ab/5772596+diag-local/ring_attn_perf
  run s100_$r MK_DIAG_STAGGER_NS=100000 $B/ab/317301e+diag-stagger/ring_attn_perf
  run s25_$r MK_DIAG_STAGGER_NS=25000 $B/ab/317301e+diag-stagger/ring_attn_perf
done
