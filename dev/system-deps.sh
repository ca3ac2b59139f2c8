#!/usr/bin/env bash
# Installs the system packages the test suite uses (openssh for the kolorun-over-ssh tests).
set -euo pipefail
if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "dev/system-deps.sh: openssh-server is missing; install it (apt-get install openssh-server openssh-client) or run as root" >&2
  exit 1
fi
echo "== installing openssh-server and openssh-client (apt)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
