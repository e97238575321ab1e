#!/usr/bin/env bash
# The README's two quick-start commands.
#   contrib/quickstart.sh demo    install what is missing, build, run 4-rank torch jobs (gloo, dc)
#   contrib/quickstart.sh check   install what is missing, build, run `make check`
# Packages come from apt (Debian 12); as root they are installed directly, otherwise with sudo.
# torch comes from the Python package index: the newest release, in a virtualenv outside the
# source tree ($PYTORCH_EXEC_VENV, default /var/cache/pytorch_exec/venv-torch), created once and
# reused (the Linux wheel is the CUDA build: a few GB; it runs on CPU).
# The build is in ./build (VPATH); re-running only rebuilds what changed.
set -euo pipefail

mode=${1:-}
case "$mode" in
  demo|check) ;;
  *) echo "usage: $0 demo|check" >&2; exit 2 ;;
esac
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=$(nproc 2>/dev/null || echo 2)

packages=(
  build-essential pkg-config autoconf automake libtool autoconf-archive
  libevent-dev libhwloc-dev hwloc-nox libpmix-dev libpmix-bin
  libboost-program-options-dev libspdlog-dev libfmt-dev libgtest-dev libssl-dev
  libopenmpi-dev openmpi-bin python3 python3-venv python3-mpi4py procps
  clang libclang-rt-14-dev iproute2
  munge slurm-wlm slurmd slurmctld slurm-client
)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "quickstart: missing packages (install them as root): ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  echo "quickstart: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

venv=${PYTORCH_EXEC_VENV:-/var/cache/pytorch_exec/venv-torch}
torch_python=$venv/bin/python

# The virtualenv with torch, when it is missing or has no torch.
setup_venv() {
  case "$(realpath -m "$venv")/" in
    "$top"/*) echo "quickstart: PYTORCH_EXEC_VENV=$venv is inside the source tree; choose another place" >&2; exit 2 ;;
  esac
  "$torch_python" -c 'import torch, numpy' 2>/dev/null && return 0
  echo "quickstart: installing the newest torch into $venv (a few GB, once)"
  mkdir -p "$(dirname "$venv")"
  [ -x "$torch_python" ] || /usr/bin/python3 -m venv "$venv"
  "$torch_python" -m pip install -q --progress-bar off torch numpy
}

build() {
  [ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi
  mkdir -p build
  cd build
  # configured for the virtualenv's torch (the dc backend); again when it was not
  grep -qF -- "--with-torch=$torch_python" config.status 2>/dev/null || ../configure --with-torch="$torch_python"
  make -j"$jobs"
}

# One line for CI: counts every test script and binary that `make check` ran.
summary() {
  local pass=0 fail=0 skip=0 r
  while IFS= read -r r; do
    case "$r" in
      PASS|XFAIL) pass=$((pass + 1)) ;;
      SKIP) skip=$((skip + 1)) ;;
      *) fail=$((fail + 1)) ;;
    esac
  done < <(find . -name '*.trs' -exec sed -n 's/^:test-result: //p' {} + 2>/dev/null)
  echo "$pass passed, $fail failed, $skip skipped"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
}

install_missing
setup_venv
export PE_TORCH_PYTHON=$torch_python
build
case "$mode" in
  demo)
    ./src/exec/pytorch_exec -n 4 --tag-output "$torch_python" ../examples/hello_allreduce.py
    PYTHONPATH=$PWD/python ./src/exec/pytorch_exec -n 4 --tag-output "$torch_python" ../examples/ddp_dc.py
    ;;
  check)
    find . -name '*.trs' -delete
    rc=0
    make -k -j"$jobs" check || rc=$?
    for log in $(find . -name 'test-suite.log'); do
      grep -q '^# FAIL: *0' "$log" && grep -q '^# ERROR: *0' "$log" || cat "$log"
    done
    summary || rc=1
    exit $rc
    ;;
esac
