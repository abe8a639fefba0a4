#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for the tests, from Debian's packages, and prints its URL.
#
#   server.sh DIR PID
#
# DIR holds its data and socket; the server stops once process PID (the test binary) has ended.
# It listens on 127.0.0.1 only, asks the role `kavi` for its password (SCRAM), and skips fsync:
# it lives for one test run. initdb refuses to run as root, so as root the server runs as
# `nobody`. The URL it prints carries the password.
set -euo pipefail
dir=$1 watch=$2

find_initdb() {
    command -v initdb || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true
}
initdb=$(find_initdb)
# Tests never install it: .ci/run does.
if [[ -z $initdb || ! -x $initdb ]]; then
    echo "PostgreSQL is not installed (.ci/run installs it; Debian: apt-get install postgresql)" >&2
    exit 3
fi
bin=$(dirname "$(readlink -f "$initdb")")

as=()
if [[ $(id -u) == 0 ]]; then
    chown nobody "$dir"
    as=(runuser -u nobody --)
fi
password=kavi-test-$RANDOM$RANDOM
printf '%s\n' "$password" > "$dir/password"
chmod 644 "$dir/password"
"${as[@]}" "$bin/initdb" -D "$dir/data" -U kavi -A scram-sha-256 --pwfile="$dir/password" \
    -E UTF8 --no-sync > "$dir/initdb.log" 2>&1
rm "$dir/password"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start > /dev/null

# Gone with the tests: nothing is left running after them.
setsid bash -c "while kill -0 $watch 2>/dev/null; do sleep 1; done
    ${as[*]} '$bin/pg_ctl' -D '$dir/data' -m immediate stop > /dev/null 2>&1
    rm -rf '$dir'" < /dev/null > /dev/null 2>&1 &

echo "postgres://kavi:$password@127.0.0.1:$port"
