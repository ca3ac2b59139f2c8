#!/usr/bin/env bash
# Installs the system packages kolo's jobs and tests use, when missing (Debian/Ubuntu, apt):
#   java (a JRE 17+) for PySpark — always;
#   a JDK 17 and Maven for kolo's Spark plugin (jvm/, built by dev/build-jvm.sh) — always;
#   openssh-server/-client for the kolorun-over-ssh tests — with --tests;
#   Open MPI (mpirun.openmpi, libmpi for mpi4py's binary wheel) and MPICH (mpirun.mpich) for
#   the mpirun/srun tests (tests/test_mpi.py) — with --tests. Debian keeps `mpirun` on Open MPI.
#   iproute2 (ip, tc, ss) for the namespace hosts of tests/test_multihost.py — with --tests
#   (unshare and nsenter come with util-linux; the tests need root and skip without it).
set -euo pipefail
packages=()
if ! command -v java >/dev/null 2>&1; then
  packages+=(openjdk-17-jre-headless)
fi
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
  packages+=(openjdk-17-jdk-headless maven)
fi
if [ "${1:-}" = "--tests" ] && ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
  packages+=(openssh-server openssh-client)
fi
if [ "${1:-}" = "--tests" ] && ! { command -v ip && command -v tc && command -v ss; } >/dev/null 2>&1; then
  packages+=(iproute2)
fi
if [ "${1:-}" = "--tests" ] && ! command -v mpirun.openmpi >/dev/null 2>&1; then
  packages+=(openmpi-bin)
fi
if [ "${1:-}" = "--tests" ] && ! command -v mpirun.mpich >/dev/null 2>&1; then
  packages+=(mpich)
fi
if [ ${#packages[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "dev/system-deps.sh: missing ${packages[*]}; install them (apt-get install ${packages[*]}) or run as root" >&2
  exit 1
fi
echo "== installing ${packages[*]} (apt)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
