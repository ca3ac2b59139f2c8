#!/bin/sh
# Starts a throwaway sshd on 127.0.0.1 for tests of kolorun's ssh path.
#
#   tests/support/start_sshd.sh DIR PORT
#
# Creates DIR (host key, client key DIR/id_ed25519 authorised for the current user, config,
# log DIR/sshd.log, and DIR/known_hosts pinning the host key for [127.0.0.1]:PORT), starts sshd
# in the background listening on 127.0.0.1:PORT only, writes its pid to DIR/sshd.pid, and
# returns once a key login with host key checking works. Prints nothing on success; on failure
# prints the reason (and the sshd log) to stderr and exits non-zero.
#
# Use:  KOLO_SSH_KNOWN_HOSTS=DIR/known_hosts \
#         kolorun -H 127.0.0.1:2 -p PORT --ssh-identity-file DIR/id_ed25519 CMD...
#       KOLO_TEST_SSH_PORT=PORT KOLO_TEST_SSH_KEY=DIR/id_ed25519 cargo test --release -p kolo-collective
# Stop: kill "$(cat DIR/sshd.pid)"
# Needs openssh-server and openssh-client (Debian: apt-get install openssh-server openssh-client).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 DIR PORT" >&2
    exit 2
fi
dir=$1
port=$2

sshd=$(command -v sshd || true)
[ -n "$sshd" ] || { [ -x /usr/sbin/sshd ] && sshd=/usr/sbin/sshd; } || true
if [ -z "$sshd" ]; then
    echo "$0: sshd not found (install openssh-server)" >&2
    exit 1
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
chmod 700 "$dir"
# sshd's privilege-separation directory (only creatable, and only needed, as root).
mkdir -p /run/sshd 2>/dev/null || true

[ -f "$dir/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C kolo-test-host -f "$dir/host_ed25519"
[ -f "$dir/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C kolo-test-client -f "$dir/id_ed25519"
cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
# The client checks the server's key against this file (kolorun: KOLO_SSH_KNOWN_HOSTS).
printf '[127.0.0.1]:%s %s\n' "$port" "$(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" > "$dir/known_hosts"
chmod 600 "$dir/authorized_keys" "$dir/host_ed25519" "$dir/id_ed25519"

cat > "$dir/sshd_config" <<CONFIG
Port $port
ListenAddress 127.0.0.1
HostKey $dir/host_ed25519
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
X11Forwarding no
PrintMotd no
LogLevel ERROR
CONFIG

if [ -f "$dir/sshd.pid" ] && kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null; then
    kill "$(cat "$dir/sshd.pid")" 2>/dev/null || true
    sleep 0.2
fi
"$sshd" -D -f "$dir/sshd_config" -E "$dir/sshd.log" </dev/null >/dev/null 2>&1 &
echo $! > "$dir/sshd.pid"

tries=0
until ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$dir/known_hosts" \
        -o LogLevel=ERROR -o ConnectTimeout=2 -p "$port" -i "$dir/id_ed25519" 127.0.0.1 true \
        </dev/null >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ $tries -ge 50 ] || ! kill -0 "$(cat "$dir/sshd.pid")" 2>/dev/null; then
        echo "$0: sshd on 127.0.0.1:$port did not accept a key login" >&2
        cat "$dir/sshd.log" >&2 2>/dev/null || true
        kill "$(cat "$dir/sshd.pid")" 2>/dev/null || true
        exit 1
    fi
    sleep 0.2
done
