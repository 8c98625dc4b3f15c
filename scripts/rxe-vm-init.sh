#!/bin/sh
# /init of the soft-RoCE VM (scripts/rxe-vm.sh): bring up rxe0 on lo and rxe1 on dummy0, run
# the loopback cases over verbs (or the benchmarks), print RESULT lines, power off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/infiniband /tmp
echo "INFO guest up at $(cut -d' ' -f1 /proc/uptime) s"
for m in crc32_generic rdma_rxe rdma_ucm dummy; do modprobe $m || echo "INFO modprobe $m failed"; done
ip link set lo up
# rxe's packets to lo go through the per-CPU backlog (1000 packets by default, a quarter of a
# 1 MiB burst... of four): a drop costs a go-back-N retransmission after the ACK timeout.
echo 100000 > /proc/sys/net/core/netdev_max_backlog
ip link set dummy0 up 2>/dev/null || { ip link add dummy0 type dummy; ip link set dummy0 up; }
ip addr add 10.77.0.1/24 dev dummy0
rdma link add rxe0 type rxe netdev lo || echo "INFO rdma link add rxe0 failed"
rdma link add rxe1 type rxe netdev dummy0 || echo "INFO rdma link add rxe1 failed"
sleep 1
ibv_devinfo -l | sed 's/^/INFO /'
cd /mk
export NCCL_MK_TRANSPORT=ib NCCL_MK_SOCKET_IFNAME=lo

run() { # name, then env assignments and the case
  name="$1"; shift
  t0=$(cut -d' ' -f1 /proc/uptime)
  env "$@" > /tmp/out 2>&1
  rc=$?
  t1=$(cut -d' ' -f1 /proc/uptime)
  sed 's/^/  /' /tmp/out | tail -25
  case $rc in 0) r=PASS;; 77) r=SKIP;; *) r=FAIL;; esac
  echo "RESULT $r $name (rc $rc, $(awk "BEGIN{print $t1-$t0}") s)"
}

if [ "$(cat /mk/mode)" = bench ]; then
  . /mk/bench.sh 2>/dev/null || /mk/ib_bench_all
else
  for c in sizes_0B_to_64MiB_intact depth_32_recvs_and_256_sends_in_flight \
           grouped_recv_tags_pick_buffers ordering_3000_messages \
           integrity_checker_catches_one_corrupt_byte put_lands_every_byte \
           put_signal_never_before_data reconnect_on_same_listen_comm_and_close_in_flight \
           killed_peer_gives_econnreset_within_bound connect_times_out_when_never_accepted \
           bad_arguments_einval_nothing_written iflush_reads_back_received_buffers \
           accept_drops_a_caller_that_is_not_our_peer_and_keeps_listening \
           connect_starts_over_when_its_handle_buffer_holds_another_handle \
           fini_with_a_comm_still_open_stops_its_threads_first; do
    run "ib_$c" ./loopback $c
  done
  for c in sizes_0B_to_64MiB_intact grouped_recv_tags_pick_buffers put_signal_never_before_data \
           ordering_3000_messages depth_32_recvs_and_256_sends_in_flight; do
    run "ib_qps4_$c" NCCL_MK_IB_QPS=4 ./loopback $c
  done
  # 32 receives of 1 MiB in flight: the case that found a FIFO-slot race (a clear-to-send
  # erased by the sender), now a stall detector
  run ib_stream_32_in_flight_1MiB LB_BENCH_WINDOW=32 LB_BENCH_SIZE=1048576 LB_BENCH_ITERS=300 \
      ./loopback bench_bw
  # The cross-node fused ops' proxy over verbs: a CPU stand-in for the kernel publishes
  # put+signal descriptors, each rank its own node (NCCL_MK_LOCAL_SIZE=1).
  if [ -x ./proxy_loopback ]; then
    for c in proxy_put_signal_stream_flags_never_before_data_and_byte_counters_exact \
             proxy_killed_peer_gives_async_error_within_bound_and_stops proxy_stop_joins_thread_with_puts_in_flight \
             proxy_goodbye_then_close_needs_no_agreement_and_raises_no_error \
             proxy_goodbye_without_the_peer_returns_within_its_bound \
             proxy_allgather_protocol_back_to_back_calls_with_a_delayed_rank_stay_correct \
             proxy_reducescatter_protocol_several_producers_back_to_back_stay_correct \
             proxy_allreduce_protocol_partials_then_reduced_rows_stay_correct; do
      run "ib_$c" NCCL_MK_LOCAL_SIZE=1 ./proxy_loopback $c
    done
  fi
  run ib_vdevice_over_two_devices_intact ./loopback vdevice_over_two_devices_intact
  run ib_qps2_vdevice_over_two_devices_intact NCCL_MK_IB_QPS=2 ./loopback vdevice_over_two_devices_intact
  # Informational, not counted: libfabric's verbs;ofi_rxm provider through our ofi transport
  # on the same soft-RoCE device (rxe0 on lo).
  for c in lo:sizes_0B_to_64MiB_intact dummy0:sizes_0B_to_64MiB_intact dummy0:put_signal_never_before_data; do
    i=${c%%:*}; c=${c#*:}
    env NCCL_MK_TRANSPORT=ofi NCCL_MK_OFI_PROVIDER="verbs;ofi_rxm" FI_LOG_LEVEL=warn FI_VERBS_IFACE=$i \
        timeout 120 ./loopback $c > /tmp/out 2>&1
    rc=$?
    sed 's/^/  /' /tmp/out | tail -8
    echo "INFO ofi verbs;ofi_rxm (FI_VERBS_IFACE=$i) $c: rc $rc"
  done
  # rxe has no ucontext disassociation: `rdma link delete` alone waits in the kernel until
  # the users close the device and sends them no event. Taking the netdev down first raises
  # IBV_EVENT_PORT_ERR, which the transport turns into errors; then the delete completes.
  run ib_device_removed_mid_transfer_errors LB_DEV=1 \
      LB_DEVICE_REMOVE_CMD="ip link set dummy0 down; rdma link delete rxe1" \
      ./loopback device_removed_mid_transfer_errors
  sleep 1
  if rdma link show | grep -q rxe1; then echo "RESULT FAIL rxe1_deleted_after_comms_closed";
  else echo "RESULT PASS rxe1_deleted_after_comms_closed"; fi
  rdma link show | sed 's/^/INFO after removal: /'
fi
echo "INFO all done at $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
