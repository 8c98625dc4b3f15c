#!/usr/bin/env bash
# Runs the verbs transport on a real (software) RDMA device: a qemu VM (TCG, no KVM needed)
# booting Debian's kernel with rdma_rxe, soft-RoCE devices rxe0 on lo and rxe1 on dummy0,
# and the loopback suite over verbs inside (plus NCCL_MK_IB_QPS=4, a virtual device over both
# rxe devices, iflush, and `rdma link delete` mid-transfer last).
#
#   scripts/rxe-vm.sh            # tests; ends with "N passed, N failed, N skipped"
#   scripts/rxe-vm.sh bench      # perftest vs our transport, interleaved (bench/NOTES.md)
#
# The kernel .deb is downloaded (apt-get download) and unpacked (dpkg -x) into
# $MK_BUILD/rxe-vm, never installed on the host; user-space tools come from the host's
# Debian packages (scripts/setup.sh installs them). qemu runs under a hard timeout.
set -uo pipefail
source "$(dirname "$0")/common.sh"

mode="${1:-test}"
vm_timeout="${RXE_VM_TIMEOUT:-900}"
cache="$MK_BUILD/rxe-vm"
kpkg="$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)"
kpkg="${kpkg:-linux-image-6.1.0-57-amd64}"
kver="${kpkg#linux-image-}"

# Exit 77 (meson's "skipped") when this machine cannot run the VM at all; 1 on any failure.
need() { command -v "$1" >/dev/null 2>&1 || { echo "SKIP rxe-vm: $1 missing (run scripts/setup.sh)"; exit 77; }; }
for t in qemu-system-x86_64 busybox cpio depmod modinfo rdma ib_write_bw ibv_devinfo; do need "$t"; done

[ -n "${RXE_VM_NO_BUILD:-}" ] || mk_build || { echo "build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
mkdir -p "$cache"

# ---- kernel from Debian's package, unpacked into the cache --------------------------------
if [ ! -d "$cache/kernel/lib/modules/$kver" ]; then
  (cd "$cache" && rm -f linux-image-*.deb && apt-get download "$kpkg" >/dev/null) ||
    { echo "SKIP rxe-vm: apt-get download $kpkg failed (no package mirror reachable?)"; exit 77; }
  rm -rf "$cache/kernel" && dpkg -x "$cache"/linux-image-*.deb "$cache/kernel"
  depmod -b "$cache/kernel" "$kver"
fi

# ---- initramfs ------------------------------------------------------------------------------
root="$cache/root"
rm -rf "$root" && mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,mk,lib64,usr/bin}
cp /usr/bin/busybox "$root/bin/busybox"
for a in sh mount mkdir cat echo sleep ls grep sed poweroff modprobe insmod ip seq date tail \
         head wc dmesg uptime awk sort kill true false env timeout cut tr ps tee; do
  ln -sf busybox "$root/bin/$a"
done
ln -sf ../bin/busybox "$root/sbin/modprobe"   # the kernel asks for crc32 through it

copy_with_libs() { # binary or library, plus what ldd says it needs, at the same paths
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")" && cp -L "$f" "$root$f"
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3} $1 ~ /^\/lib/{print $1}' | while read -r l; do
      [ -e "$root$l" ] || { mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"; }
    done
  done
}
prov=/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
copy_with_libs /usr/bin/rdma /usr/bin/ibv_devinfo /usr/bin/ib_write_bw /usr/bin/ib_write_lat \
  /usr/sbin/ip "$prov" /usr/lib/x86_64-linux-gnu/libibverbs.so.1 \
  "$(ls /usr/lib/x86_64-linux-gnu/libfabric.so.1 2>/dev/null)"
mkdir -p "$root/etc/libibverbs.d" && cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
cp "$MK_BUILD/test/loopback/loopback" "$root/mk/" && copy_with_libs "$MK_BUILD/test/loopback/loopback"
if [ -x "$MK_BUILD/test/loopback/proxy_loopback" ]; then # the fused ops' proxy (issue 13)
  cp "$MK_BUILD/test/loopback/proxy_loopback" "$root/mk/" && copy_with_libs "$MK_BUILD/test/loopback/proxy_loopback"
fi
cp "$MK_BUILD"/libnccl-net-mk.so "$root/mk/"
cp "$MK_ROOT/scripts/rxe-vm-bench.sh" "$root/mk/bench.sh"
[ -n "${RXE_VM_EXTRA_BIN:-}" ] && cp "$RXE_VM_EXTRA_BIN" "$root/mk/"  # A/B: another build

kmods="$cache/kernel/lib/modules/$kver"
modlist=""
add_mod() { # a module and, recursively, what it depends on
  local m="$1" f deps d
  f="$(modinfo -b "$cache/kernel" -k "$kver" -F filename "$m" 2>/dev/null)" || return 0
  case " $modlist " in *" $f "*) return 0;; esac
  modlist="$modlist $f"
  deps="$(modinfo -b "$cache/kernel" -k "$kver" -F depends "$m" 2>/dev/null | tr , ' ')"
  for d in $deps; do add_mod "$d"; done
}
for m in rdma_rxe ib_uverbs rdma_ucm crc32_generic dummy; do add_mod "$m"; done
for f in $modlist; do
  rel="${f#$cache/kernel}"; mkdir -p "$root$(dirname "$rel")"; cp "$f" "$root$rel"
done
cp "$kmods"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null
depmod -b "$root" "$kver"

cp "$MK_ROOT/scripts/rxe-vm-init.sh" "$root/init" && chmod +x "$root/init"
echo "$mode" > "$root/mk/mode"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/initrd.gz"

# ---- boot -------------------------------------------------------------------------------
log="$cache/console-$mode.log"
t0=$(date +%s)
timeout --signal=KILL "$vm_timeout" qemu-system-x86_64 -m 3072 -smp 2 -nographic -no-reboot \
  -kernel "$cache/kernel/boot/vmlinuz-$kver" -initrd "$cache/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 loglevel=3" -nic none > "$log" 2>&1
qrc=$?
t1=$(date +%s)
tr -d '\r' < "$log" | grep -E '^(RESULT|BENCH|INFO|case |  )' || true
echo "rxe-vm: qemu exited with $qrc after $((t1 - t0)) s (console log: $log)"
pass=$(tr -d '\r' < "$log" | grep -c '^RESULT PASS')
fail=$(tr -d '\r' < "$log" | grep -c '^RESULT FAIL')
skip=$(tr -d '\r' < "$log" | grep -c '^RESULT SKIP')
if ! tr -d '\r' < "$log" | grep -q '^INFO all done'; then
  echo "rxe-vm: the VM did not finish its run (timeout ${vm_timeout}s or crash)"; fail=$((fail + 1))
fi
if [ "$mode" = bench ]; then # medians per (what, size), and our ratio to perftest
  tr -d '\r' < "$log" | grep '^BENCH' | sort -k2,2 -k3,3n | awk '
    { k = $2 " " $3; v[k] = v[k] " " $4; if (NF > 4) a[k] = a[k] " " $5 }
    function med(s,   n, x, i, j, t) { n = split(s, x, " ");
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
      return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2 }
    END { for (k in v) { m[k] = med(v[k]); printf "MEDIAN %s: %s (runs:%s)\n", k, m[k], v[k] }
          for (k in m) if (k ~ /^mk_/) { p = k; sub(/^mk_/, "perftest_", p); sub(/_w8/, "", p);
            if (p in m) printf "RATIO %s: %.2f x perftest\n", k, m[k] / m[p] } }' | sort
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
