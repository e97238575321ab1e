#!/usr/bin/env bash
# A SLURM cluster of four virtual nodes (n1..n4) on this machine, for tests and benchmarks:
# munged, slurmctld and four slurmd (SLURM's MULTIPLE_SLURMD build).  Each node has a TmpFS of
# its own (TmpFS=.../tmp/%n): the mpi/pmix plugin's spmix_appdir_* directories of the four nodes
# would collide in one /tmp otherwise.
#
#   contrib/slurm/testbed.sh start     start it (or find it running); prints what to export
#   contrib/slurm/testbed.sh stop      stop everything it started (by pid), nothing else
#   contrib/slurm/testbed.sh status    exit 0 when its own 4 nodes are up
#   contrib/slurm/testbed.sh env       the variables a shell needs: eval "$(testbed.sh env)"
#
# Another SLURM may run on the machine: `start` takes five free TCP ports (the controller's and
# one per slurmd) from $PE_SLURM_PORT (default 17100) upwards, or, when PE_SLURM_PORT is set,
# exactly those and fails naming the ones taken.  It succeeds only once its own slurmctld and
# four slurmd (the pids in their pid files, started with this configuration) listen on its own
# ports and its own controller lists the four nodes idle; otherwise it fails with the reason.
#
# Needs root, munge and SLURM (Debian: munge slurm-wlm slurmd slurmctld slurm-client).  State,
# configuration and logs live in $PE_SLURM_DIR (default /var/tmp/pytorch_exec-slurm).
set -euo pipefail

dir=${PE_SLURM_DIR:-/var/tmp/pytorch_exec-slurm}
conf=$dir/slurm.conf
nodes=(n1 n2 n3 n4)
cpus=${PE_SLURM_CPUS:-2}
timeout=${PE_SLURM_TIMEOUT:-60}
marker=" # pytorch_exec testbed $dir"

die() { echo "testbed.sh: $*" >&2; exit 1; }

need() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd and the private /tmp mounts need it)"
  for b in munged slurmctld slurmd sinfo srun salloc; do
    command -v "$b" >/dev/null || die "$b not found (apt-get install munge slurm-wlm slurmd slurmctld slurm-client)"
  done
}

# TCP ports something listens on, one a line.
listening() { ss -Htln | awk '{ n = split($4, a, ":"); print a[n] }' | sort -un; }

# Sets `port` (the controller's; the slurmd take the next four): PE_SLURM_PORT exactly, else the
# first block of five free ports from 17100 in steps of 10.
pick_ports() {
  local taken busy p base
  taken=$(listening)
  for base in ${PE_SLURM_PORT:-$(seq 17100 10 17990)}; do
    busy=()
    for p in $(seq "$base" $((base + ${#nodes[@]}))); do
      grep -qx "$p" <<<"$taken" && busy+=("$p")
    done
    if [ ${#busy[@]} -eq 0 ]; then port=$base; return 0; fi
    [ -n "${PE_SLURM_PORT:-}" ] &&
      die "PE_SLURM_PORT=$base: port(s) ${busy[*]} already in use (the test bed needs $base..$((base + ${#nodes[@]})))"
  done
  die "no five free ports between 17100 and 17994"
}

# The ports of the configuration written last.
conf_port() { sed -n 's/^SlurmctldPort=//p' "$conf"; }

write_conf() {
  local host
  host=$(hostname)
  pick_ports
  mkdir -p "$dir/state" "$dir/log" "$dir/spool"
  for n in "${nodes[@]}"; do mkdir -p "$dir/tmp/$n" "$dir/spool/$n"; chmod 1777 "$dir/tmp/$n"; done
  cat > "$conf" <<CONF
# Written by contrib/slurm/testbed.sh: four virtual nodes on $host.
ClusterName=pytorchexec
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
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
NodeName=n[1-4] NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1))-$((port + ${#nodes[@]})) CPUs=$cpus State=UNKNOWN
PartitionName=pe Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:16
CONF
}

# The pid in pid file $1 when that process runs with this test bed's configuration.
own_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-f $conf " || return 1
  echo "$pid"
}

# Whether process $1 listens on TCP port $2.
listens_on() { ss -Htlnp "sport = :$2" 2>/dev/null | grep -q "pid=$1,"; }

# Nodes its own controller lists as usable.
up() { SLURM_CONF=$conf timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true; }

# Nothing when its own daemons run and listen on its own ports and its controller lists the four
# nodes usable; otherwise one line per problem.
problems() {
  [ -f "$conf" ] || { echo "not started ($conf does not exist)"; return; }
  local p pid i=1 n
  p=$(conf_port)
  if ! pid=$(own_pid "$dir/slurmctld.pid"); then
    echo "slurmctld is not running (see $dir/log/slurmctld.log)"
  elif ! listens_on "$pid" "$p"; then
    echo "slurmctld (pid $pid) does not listen on port $p"
  fi
  for n in "${nodes[@]}"; do
    if ! pid=$(own_pid "$dir/slurmd.$n.pid"); then
      echo "slurmd of $n is not running: $(last_error "$dir/log/slurmd.$n.log")"
    elif ! listens_on "$pid" $((p + i)); then
      echo "slurmd of $n (pid $pid) does not listen on port $((p + i))"
    fi
    i=$((i + 1))
  done
  n=$(up)
  [ "$n" -eq ${#nodes[@]} ] || echo "its controller lists $n of ${#nodes[@]} nodes idle"
}

last_error() { grep -iE 'error|fatal' "$1" 2>/dev/null | tail -n 1 || true; }

wait_up() {
  local deadline=$((SECONDS + timeout)) started=$SECONDS why
  while why=$(problems) && [ -n "$why" ]; do
    # A daemon that has exited (a port taken meanwhile, a bad configuration) will not come up.
    if [ $SECONDS -ge $deadline ] ||
      { [ $((SECONDS - started)) -ge 5 ] && grep -q "not running" <<<"$why"; }; then
      fail_start "the test bed did not come up within $((SECONDS - started)) s:"$'\n'"$why"
    fi
    sleep 0.2
  done
  # The controller may list nodes as idle from its saved state before their slurmd answers: a
  # step on all of them proves they do.
  until SLURM_CONF=$conf timeout 20 srun -N ${#nodes[@]} -n ${#nodes[@]} --mpi=none true >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      fail_start "srun on the four nodes does not work (logs in $dir/log)"
    fi
    sleep 0.5
  done
}

# A start that failed leaves nothing running.
fail_start() {
  stop
  die "$@"
}

start_munged() {
  pgrep -x munged >/dev/null && return 0
  mkdir -p /run/munge
  chown munge:munge /run/munge 2>/dev/null || true
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c munged 2>/dev/null || munged --force
  else
    munged --force
  fi
  cp /run/munge/munged.pid "$dir/munged.pid" 2>/dev/null || die "munged did not start"
}

start() {
  need
  if [ -z "$(problems)" ]; then print_env; return 0; fi
  stop_daemons
  write_conf
  start_munged
  # Programs reach rank 0's node by its SLURM name (MASTER_ADDR under srun): make n1..n4 resolve.
  for n in "${nodes[@]}"; do
    getent hosts "$n" >/dev/null || echo "127.0.0.1 $n$marker" >>/etc/hosts
  done
  slurmctld -f "$conf" -i || fail_start "slurmctld did not start (logs in $dir/log)"
  for n in "${nodes[@]}"; do
    slurmd -f "$conf" -N "$n" || fail_start "slurmd of $n did not start (logs in $dir/log)"
  done
  wait_up
  print_env
}

# Whether process $1's working directory or an open file is under $2.
works_in() {
  local f
  for f in "/proc/$1/cwd" "/proc/$1"/fd/*; do
    [[ "$(readlink "$f" 2>/dev/null)" == "$2"* ]] && return 0
  done
  return 1
}

# Ends (by pid) its own slurmctld, slurmd and step daemons.
stop_daemons() {
  [ -f "$conf" ] || return 0
  SLURM_CONF=$conf timeout 10 scancel --user=root >/dev/null 2>&1 || true
  local pids=() f pid
  for f in "$dir"/slurmd.*.pid "$dir/slurmctld.pid"; do
    pid=$(own_pid "$f") && pids+=("$pid")
    rm -f "$f"
  done
  # Step daemons outlive slurmd; one left from before would take the next job with its id.  Its
  # own are those working in its spool directories.
  for pid in $(pgrep -x slurmstepd || true); do
    works_in "$pid" "$dir/" && pids+=("$pid")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.05; done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

stop() {
  stop_daemons
  if grep -qF -- "$marker" /etc/hosts; then
    grep -vF -- "$marker" /etc/hosts >"$dir/hosts.new" && cat "$dir/hosts.new" >/etc/hosts
    rm -f "$dir/hosts.new"
  fi
  local pid
  if pid=$(cat "$dir/munged.pid" 2>/dev/null) && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]; then
    # Another SLURM on the machine may use the munged it started: then it stays.
    if ps -eo stat=,comm= | awk '$1 !~ /^Z/ && $2 ~ /^(slurmctld|slurmd|slurmdbd)$/ { f = 1 } END { exit !f }'; then
      echo "testbed.sh: munged (pid $pid) left running: another SLURM uses it" >&2
    else
      # Gone before this returns: a start right after would take a munged still ending for one
      # that runs (pgrep), and the nodes then fail to register (authentication errors).
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$dir/munged.pid"
}

print_env() { echo "export SLURM_CONF=$conf"; }

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) [ -z "$(problems)" ] ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
