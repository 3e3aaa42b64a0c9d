#!/usr/bin/env bash
# A throwaway PostgreSQL (Debian's packages) for tests and benchmarks, in a
# private directory on a private port, as scripts/s3-test-server.sh does for S3.
#
#   scripts/postgres-test-server.sh install       apt-get install postgresql (root; skipped
#                                                 when initdb is found)
#   scripts/postgres-test-server.sh start DIR PORT
#                                                 initdb DIR/data (user "bench", trust auth,
#                                                 UTF8) unless it exists, start it on
#                                                 127.0.0.1:PORT (socket in DIR, fsync on),
#                                                 wait until it accepts connections; print
#                                                 dsn=postgresql://bench@127.0.0.1:PORT/postgres
#                                                 and pid=; the pid is in DIR/data/postmaster.pid
#   scripts/postgres-test-server.sh stop DIR      stop the server started with DIR (fast mode)
#
# initdb refuses to run as root: as root the cluster runs as the `postgres` user
# (runuser), which then owns DIR. Binaries: the newest /usr/lib/postgresql/*/bin,
# or $PG_BINDIR.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit 2
}

bindir() {
    if [[ -n ${PG_BINDIR:-} ]]; then
        echo "$PG_BINDIR"
        return
    fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [[ -z $found || ! -x $found/initdb ]]; then
        echo "no PostgreSQL server binaries: run '$0 install' (apt-get install postgresql)" >&2
        exit 1
    fi
    echo "$found"
}

as_owner() {
    if [[ $(id -u) == 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

cmd_install() {
    if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        echo "PostgreSQL is installed: $(bindir)"
        return
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql >/dev/null
    echo "installed: $(bindir)"
}

cmd_start() {
    local dir=$1 port=$2 bin
    bin=$(bindir)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ $(id -u) == 0 ]]; then
        chown postgres "$dir"
    fi
    if [[ ! -f $dir/data/PG_VERSION ]]; then
        as_owner "$bin/initdb" -D "$dir/data" -U bench --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 || {
            cat "$dir/initdb.log" >&2
            exit 1
        }
    fi
    local opts="-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=on"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "$opts" -w -t 60 start >/dev/null || {
        cat "$dir/server.log" >&2
        exit 1
    }
    "$bin/pg_isready" -h 127.0.0.1 -p "$port" -t 30 >/dev/null
    echo "dsn=postgresql://bench@127.0.0.1:$port/postgres"
    echo "pid=$(head -n 1 "$dir/data/postmaster.pid")"
}

cmd_stop() {
    local dir=$1 bin
    bin=$(bindir)
    if [[ -f $dir/data/postmaster.pid ]]; then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
}

case ${1:-} in
    install) [[ $# == 1 ]] || usage; cmd_install ;;
    start) [[ $# == 3 ]] || usage; cmd_start "$2" "$3" ;;
    stop) [[ $# == 2 ]] || usage; cmd_stop "$2" ;;
    *) usage ;;
esac
