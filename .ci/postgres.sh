# Sourced by .ci/run: a throwaway PostgreSQL on loopback for tests/test_storage.py, exported as
# NMMC_TEST_POSTGRES_URL (that test fails in CI without it) and stopped on exit. Installs Debian's
# postgresql with apt-get when it is missing and we are root. Does nothing if the URL is already set.
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ -z "${NMMC_TEST_POSTGRES_URL:-}" ]; then
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
  PGPORT_NMMC=${NMMC_PGPORT:-55432}
  PGDIR=$(mktemp -d /tmp/nmmc-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then chown postgres "$PGDIR"; fi
  trap 'as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$PGDIR"' EXIT
  as_pg "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT_NMMC -k $PGDIR" start >/dev/null
  as_pg "$PGBIN/psql" -q -h "$PGDIR" -p "$PGPORT_NMMC" -U postgres -d postgres \
    -c "CREATE ROLE nmmc LOGIN PASSWORD 'nmmc'" -c "CREATE DATABASE nmmc_test OWNER nmmc"
  export NMMC_TEST_POSTGRES_URL="postgresql://nmmc:nmmc@127.0.0.1:$PGPORT_NMMC/nmmc_test"
fi
