#!/usr/bin/env bash
# The machine parts the suite uses that are not Python packages, installed from Debian and started
# on loopback when they are missing (`make test` and `.ci/run` call this; `make demo` needs none):
#
# - PostgreSQL (the production path of the platform state, Airflow's metadata and MLflow's store):
#   the machine's cluster, started, with the database `test`; user `postgres` connects over
#   127.0.0.1 without a password (trust for that user on loopback only: the tests create and
#   drop databases of their own);
# - Redis on 127.0.0.1:6379 (the Celery broker of the production-path test), no persistence;
# - Debian's Chromium, which the UI tests drive through Playwright (no browser download);
# - Debian's nftables (the `nft` tool only: nothing is loaded into this machine's own tables), with
#   which the simulated nodes' policy enforcer programs their fabric namespace's packet filter
#   (tests/support/kube/netpol_enforcer.py).
#
# Idempotent: what already answers is left alone. Without root nothing is installed or
# reconfigured; a test whose part is still missing then skips, saying how to provide it
# (or fails where TRAINYARD_REQUIRE names that part, as in CI).
set -uo pipefail

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
root() { [ "$(id -u)" = 0 ]; }
need=()
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v nft >/dev/null 2>&1 || need+=(nftables)
if [ ${#need[@]} -gt 0 ]; then
  if root; then
    echo "services: installing ${need[*]} from Debian (once)"
    started=$(date +%s)
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null; } || echo "services: apt-get could not install ${need[*]}"
    echo "services: installed in $(( $(date +%s) - started )) s"
  else
    echo "services: missing ${need[*]} (not root: not installed; their tests skip)"
  fi
fi

if command -v pg_ctlcluster >/dev/null 2>&1 && root; then
  [ -n "$(ls /etc/postgresql 2>/dev/null)" ] || pg_createcluster --start-conf=manual 15 main >/dev/null
  version=$(ls /etc/postgresql | sort -n | tail -1)
  hba=/etc/postgresql/$version/main/pg_hba.conf
  rule="host    all             postgres        127.0.0.1/32            trust"
  changed=
  if ! grep -qF "$rule" "$hba"; then  # before the password rules: the first matching line wins
    { echo "# trainyard tests: user postgres, loopback only"; echo "$rule"; cat "$hba"; } > "$hba.new"
    chown --reference="$hba" "$hba.new"; chmod --reference="$hba" "$hba.new"; mv "$hba.new" "$hba"
    changed=1
  fi
  if ! answers 5432; then
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || echo "services: PostgreSQL did not start"
  elif [ -n "$changed" ]; then
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload || true
  fi
fi
if answers 5432 && root && command -v psql >/dev/null 2>&1; then
  su postgres -c "psql -qtAc \"select 1 from pg_database where datname = 'test'\"" | grep -q 1 \
    || su postgres -c "createdb test" || echo "services: could not create the database test"
fi

if ! answers 6379 && command -v redis-server >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /tmp --logfile /tmp/redis-trainyard-tests.log >/dev/null || echo "services: Redis did not start"
fi
exit 0
