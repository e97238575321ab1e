#!/usr/bin/env bash
# A SLURM cluster of four virtual nodes (n1..n4) on this machine, for tests and benchmarks:
# munged, slurmctld and four slurmd (SLURM's MULTIPLE_SLURMD build).  Each node has a TmpFS of
# its own (TmpFS=.../tmp/%n): the mpi/pmix plugin's spmix_appdir_* directories of the four nodes
# would collide in one /tmp otherwise.
#
#   contrib/slurm/testbed.sh start     start it (or find it running); prints what to export
#   contrib/slurm/testbed.sh stop      stop everything it started
#   contrib/slurm/testbed.sh status    exit 0 when 4 nodes are up
#   contrib/slurm/testbed.sh env       the variables a shell needs: eval "$(testbed.sh env)"
#
# Needs root, munge and SLURM (Debian: munge slurm-wlm slurmd slurmctld slurm-client).  State,
# configuration and logs live in $PE_SLURM_DIR (default /var/tmp/pytorch_exec-slurm).
set -euo pipefail

dir=${PE_SLURM_DIR:-/var/tmp/pytorch_exec-slurm}
conf=$dir/slurm.conf
nodes=(n1 n2 n3 n4)
cpus=${PE_SLURM_CPUS:-2}
timeout=${PE_SLURM_TIMEOUT:-60}

die() { echo "testbed.sh: $*" >&2; exit 1; }

need() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd and the private /tmp mounts need it)"
  for b in munged slurmctld slurmd sinfo srun salloc; do
    command -v "$b" >/dev/null || die "$b not found (apt-get install munge slurm-wlm slurmd slurmctld slurm-client)"
  done
}

write_conf() {
  local host
  host=$(hostname)
  mkdir -p "$dir/state" "$dir/log" "$dir/spool"
  for n in "${nodes[@]}"; do mkdir -p "$dir/tmp/$n" "$dir/spool/$n"; chmod 1777 "$dir/tmp/$n"; done
  cat > "$conf" <<CONF
# Written by contrib/slurm/testbed.sh: four virtual nodes on $host.
ClusterName=pytorchexec
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=17100
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
TmpFS=$dir/tmp/%n
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=17101-17104 CPUs=$cpus State=UNKNOWN
PartitionName=pe Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
CONF
}

up() { SLURM_CONF=$conf sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true; }

wait_up() {
  local deadline=$((SECONDS + timeout))
  while [ "$(up)" -lt ${#nodes[@]} ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "testbed.sh: the nodes did not come up within ${timeout} s:" >&2
      SLURM_CONF=$conf sinfo -N >&2 || true
      tail -n 5 "$dir"/log/*.log >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  # The controller may list nodes as idle from its saved state before their slurmd answers: a
  # step on all of them proves they do.
  until SLURM_CONF=$conf timeout 20 srun -N ${#nodes[@]} -n ${#nodes[@]} --mpi=none true >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "srun on the four nodes does not work (logs in $dir/log)"
    sleep 0.5
  done
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  need
  if [ -f "$conf" ] && [ "$(up)" -eq ${#nodes[@]} ]; then print_env; return 0; fi
  write_conf
  if ! pgrep -x munged >/dev/null; then
    mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
    if id munge >/dev/null 2>&1; then
      su -s /bin/sh munge -c munged 2>/dev/null || munged --force
    else
      munged --force
    fi
    touch "$dir/munged.ours"
  fi
  # Programs reach rank 0's node by its SLURM name (MASTER_ADDR under srun): make n1..n4 resolve.
  for n in "${nodes[@]}"; do
    getent hosts "$n" >/dev/null || echo "127.0.0.1 $n # pytorch_exec testbed" >> /etc/hosts
  done
  alive "$dir/slurmctld.pid" || slurmctld -f "$conf" -i
  for n in "${nodes[@]}"; do
    alive "$dir/slurmd.$n.pid" && continue
    slurmd -f "$conf" -N "$n"
  done
  wait_up
  print_env
}

stop() {
  [ -f "$conf" ] || return 0
  SLURM_CONF=$conf scancel --user=root >/dev/null 2>&1 || true
  local pids=()
  for f in "$dir"/slurmd.*.pid "$dir/slurmctld.pid"; do
    [ -f "$f" ] && pids+=("$(cat "$f")") && rm -f "$f"
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.05; done
    kill -9 "${pids[@]}" 2>/dev/null || true
  fi
  # Step daemons outlive slurmd; one left from before would take the next job with its id.
  pkill -9 -x slurmstepd 2>/dev/null || true
  if grep -q ' # pytorch_exec testbed$' /etc/hosts; then
    grep -v ' # pytorch_exec testbed$' /etc/hosts > "$dir/hosts.new" && cat "$dir/hosts.new" > /etc/hosts
    rm -f "$dir/hosts.new"
  fi
  if [ -f "$dir/munged.ours" ]; then pkill -x munged || true; rm -f "$dir/munged.ours"; fi
}

print_env() { echo "export SLURM_CONF=$conf"; }

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) [ -f "$conf" ] && [ "$(up)" -eq ${#nodes[@]} ] ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
