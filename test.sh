#!/usr/bin/env bash
# test.sh: the test suite of fenceq, the command the README's "Two commands" block names.
#
#   ./test.sh            checks (gofmt, go vet, staticcheck), then the whole suite with -race
#   ./test.sh --no-lint  the suite only (outside CI; CI always runs the checks)
#   ./test.sh --busy     the same while CPU hogs keep every core busy, to flush out tests
#                        whose outcome depends on timing; --busy=N runs N hogs
#
# What it does:
#   - Finds what the tests need: PostgreSQL (a server, or the server binaries for the
#     tests' throwaway clusters), PgBouncer's binary, Chromium, Python's psycopg 3, podman
#     and runc (the container test), iproute2 (as root: the
#     network-namespace tests), and a C compiler for -race. As root it installs what is
#     missing from Debian's packages (no service is started by the install); otherwise it
#     names in one line what is missing and how to get it, and exits with status 2.
#   - Builds Citus (.ci/ensure-citus) when citus.so is missing and its source is at hand:
#     FENCEQ_VENDOR_DIR, else ../shared/vendor beside the repository. Without the source
#     the Citus test is reported as not run (FENCEQ_CITUS_NOT_BUILT tells it why it skips).
#   - Outside CI it never starts, restarts or reconfigures a PostgreSQL server it did not
#     start: the tests use TEST_DATABASE_URL when set, else the server on 127.0.0.1:5432
#     when it answers, else throwaway clusters of their own. The suite fits in the
#     server's default max_connections (100): with fewer than 200 allowed, one test
#     binary runs at a time (go test -p 1), else two.
#   - Under CI (CI=true) nothing may be missing: the Citus source is required, and the
#     local cluster is set up as CI needs it (created, started, trust on loopback,
#     max_connections raised to 300 so that two test binaries run at once).
#   - Runs go test -race -count=1 -timeout 60m ./... (its output is kept whole) and ends
#     with a summary: packages passed and failed, and what was not run.
#
# Environment: TEST_DATABASE_URL (the server the tests use), FENCEQ_VENDOR_DIR (the
# Citus source), FENCEQ_TEST_P (test binaries at once, overriding the choice above),
# FENCEQ_CHROMIUM (the browser), CI=true (nothing may be missing; set by .ci/run).
# Exit status: 0 when everything run passed, 1 on a failure, 2 when something the tests
# need is missing or an argument is wrong.
set -uo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin:$HOME/go/bin"

# usage prints the comment block above.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

busy=0
lint=1
for arg in "$@"; do
  case "$arg" in
    --busy) busy="$(nproc)" ;;
    --busy=*)
      busy="${arg#--busy=}"
      if ! [[ "$busy" =~ ^[1-9][0-9]*$ ]]; then
        echo "test.sh: --busy=N needs a positive number of hogs, got '${busy}'" >&2
        exit 2
      fi
      ;;
    --no-lint) lint=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

ci=0
[ "${CI:-}" = "true" ] && ci=1
if [ "$ci" = 1 ]; then
  export FENCEQ_CI=1
  if [ "$lint" = 0 ]; then
    echo "test.sh: --no-lint is refused under CI=true: CI runs gofmt, go vet and staticcheck" >&2
    exit 2
  fi
fi
root=0
[ "$(id -u)" = 0 ] && root=1

log() { echo "test.sh: $*" >&2; }

# cleanup runs on exit: it stops the busy mode's CPU hogs and removes the policy-rc.d
# this script put in place for an install that did not finish.
hogs=()
own_policy=""
stop_hogs() {
  local p
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${hogs[@]}"; do wait "$p" 2>/dev/null || true; done
  hogs=()
}
cleanup() {
  stop_hogs
  if [ -n "$own_policy" ]; then rm -f "$own_policy"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# not_run collects what the suite did not run, for the summary.
not_run=()

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pg_server_installed() { local b; b="$(pg_bin)"; [ -n "$b" ] && [ -x "$b/initdb" ] && [ -x "$b/pg_ctl" ]; }
pg_client_installed() { command -v psql >/dev/null 2>&1 && command -v pg_isready >/dev/null 2>&1; }
pgbouncer_installed() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }
chromium_path() { echo "${FENCEQ_CHROMIUM:-/usr/bin/chromium}"; }
# citus_installed: the check of the Citus test (pgcluster.CitusAvailable), on the newest
# server's library directory.
citus_installed() {
  local b lib
  b="$(pg_bin)"
  [ -n "$b" ] || return 1
  lib="$("$b/pg_config" --pkglibdir 2>/dev/null || pg_config --pkglibdir 2>/dev/null || true)"
  [ -n "$lib" ] || lib="$(dirname "$b")/lib"
  [ -f "$lib/citus.so" ]
}

vendor_dir="${FENCEQ_VENDOR_DIR:-$(cd .. && pwd)/shared/vendor}"
citus_source() { [ -f "$vendor_dir/citus-13.2.2.tar.gz" ]; }

# ---- what is missing -------------------------------------------------------------------
# missing_pkgs are Debian packages to install; missing_how says how to get each thing.
missing_pkgs=()
missing_how=()
need() { missing_pkgs+=("$1"); missing_how+=("$2"); }

command -v go >/dev/null 2>&1 || { echo "test.sh: go is not installed (Go $(sed -n 's/^go //p' go.mod) from go.dev/dl, or put it on PATH)" >&2; exit 2; }
command -v gcc >/dev/null 2>&1 || need gcc "gcc (for -race: apt-get install gcc)"
if [ "$ci" = 1 ]; then
  pg_server_installed || need postgresql "postgresql (apt-get install postgresql)"
  pg_client_installed || need postgresql-client "postgresql-client (apt-get install postgresql-client)"
elif [ -z "${TEST_DATABASE_URL:-}" ] && ! pg_server_installed; then
  # No server binaries: the tests can use a server on 127.0.0.1:5432 if one answers.
  if ! { pg_client_installed && pg_isready -q -h 127.0.0.1 -p 5432 -t 3; }; then
    need postgresql "postgresql (apt-get install postgresql; or set TEST_DATABASE_URL)"
  fi
fi
pgbouncer_installed || need pgbouncer "pgbouncer (apt-get install pgbouncer)"
# The SQL functions' Python example and the cross-language fence test run Python
# endpoints with Debian's interpreter and its psycopg 3.
/usr/bin/python3 -c 'import psycopg' >/dev/null 2>&1 ||
  need python3-psycopg "python3-psycopg (apt-get install python3-psycopg, for /usr/bin/python3)"
# The container test builds and runs the worker's image with podman and runc; podman's
# recommended packages (overlay storage, networking helpers) come with it.
command -v podman >/dev/null 2>&1 || need podman "podman (apt-get install podman)"
command -v runc >/dev/null 2>&1 || need runc "runc (apt-get install runc)"
[ -x "$(chromium_path)" ] || need chromium "chromium (apt-get install chromium, or set FENCEQ_CHROMIUM)"
if [ "$root" = 1 ]; then
  command -v ip >/dev/null 2>&1 || need iproute2 "iproute2 (apt-get install iproute2)"
else
  # The network-namespace tests need root: they skip, saying so (FENCEQ_CI unset).
  not_run+=("network-namespace tests: not run (need root; they skip)")
fi

# recommends prints apt-get's option for recommended packages: none, but for podman,
# whose storage and networking helpers are recommended ones.
recommends() {
  if printf '%s\n' "$@" | grep -qx podman; then
    echo "--install-recommends"
  else
    echo "--no-install-recommends"
  fi
}

# apt_install installs Debian packages without starting their services: policy-rc.d
# answering 101 keeps the packages' scripts from starting them (PgBouncer's tests start
# their own process; the tests' PostgreSQL is set up below or started by the tests).
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  local policy=/usr/sbin/policy-rc.d rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    own_policy="$policy" # removed by cleanup, also when the script is interrupted
  fi
  {
    apt-get -o DPkg::Lock::Timeout=600 update -q &&
      apt-get -o DPkg::Lock::Timeout=600 install -y -q $(recommends "$@") "$@"
  } || rc=$?
  if [ -n "$own_policy" ]; then
    rm -f "$own_policy"
    own_policy=""
  fi
  if [ "$rc" -eq 0 ] && printf '%s\n' "$@" | grep -qx pgbouncer; then
    # Nor at boot.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      systemctl disable --now pgbouncer >/dev/null 2>&1 || true
    elif command -v update-rc.d >/dev/null 2>&1; then
      update-rc.d pgbouncer disable >/dev/null 2>&1 || true
    fi
  fi
  return "$rc"
}

# Citus: as root it is built below; otherwise its build is named with the rest.
if [ "$root" = 0 ] && ! citus_installed && citus_source; then
  missing_how+=("citus (its source is at $vendor_dir; as root: FENCEQ_VENDOR_DIR=$vendor_dir bash .ci/ensure-citus)")
fi

if [ ${#missing_how[@]} -gt 0 ] && [ "$root" = 0 ]; then
  line="test.sh: missing: $(printf '%s; ' "${missing_how[@]}")"
  line="${line%; }"
  if [ ${#missing_pkgs[@]} -gt 0 ]; then
    line="$line; run ./test.sh as root to install them, or: sudo apt-get install -y ${missing_pkgs[*]}"
  fi
  echo "$line" >&2
  exit 2
fi
if [ ${#missing_pkgs[@]} -gt 0 ]; then
  if [ "$root" = 1 ]; then
    log "installing from Debian's packages: ${missing_pkgs[*]}"
    if ! apt_install "${missing_pkgs[@]}"; then
      log "installing ${missing_pkgs[*]} failed"
      exit 2
    fi
  fi
fi

# ---- Citus -----------------------------------------------------------------------------
if citus_installed; then
  :
elif citus_source; then
  # Only as root: otherwise it was named as missing above.
  log "Citus is not installed: building it from $vendor_dir (.ci/ensure-citus, a few minutes)"
  FENCEQ_VENDOR_DIR="$vendor_dir" bash .ci/ensure-citus || { log "building Citus failed"; exit 1; }
elif [ "$ci" = 1 ]; then
  log "Citus is not installed and its source is not at $vendor_dir: CI runs the Citus test (set FENCEQ_VENDOR_DIR)"
  exit 1
else
  export FENCEQ_CITUS_NOT_BUILT="no Citus source at $vendor_dir; set FENCEQ_VENDOR_DIR"
  not_run+=("citus: not run (no source at $vendor_dir; set FENCEQ_VENDOR_DIR)")
fi

# ---- PostgreSQL ------------------------------------------------------------------------
# Under CI: the machine's cluster, created if need be, trusted on loopback, started, with
# the databases the tests use. Outside CI nothing here runs: the tests find a server.
pg_for_ci() {
  local ver conf
  ver="$(basename "$(dirname "$(pg_bin)")")"
  if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^$ver main$"; then
    log "creating cluster $ver/main"
    pg_createcluster "$ver" main --port 5432 || return 1
  fi
  conf="/etc/postgresql/$ver/main"
  # Tests connect as postgres over TCP without a password (trust on loopback only).
  if ! grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+127\.0\.0\.1/32[[:space:]]+trust' "$conf/pg_hba.conf"; then
    log "allowing trust authentication on 127.0.0.1 for the test cluster"
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$conf/pg_hba.conf"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload 2>/dev/null || true
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    log "starting cluster $ver/main"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start || return 1
  fi
  local i
  for i in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 1
  done
  pg_isready -h 127.0.0.1 -p 5432 || return 1
  # Two test binaries at once need up to about 90 connections (see -p below): CI
  # makes room for them, which takes a restart of this cluster, its own.
  local maxc
  maxc="$(psql -h 127.0.0.1 -U postgres -d postgres -Atc 'SHOW max_connections')" || return 1
  if [ "$maxc" -lt 300 ]; then
    log "raising max_connections from $maxc to 300"
    psql -h 127.0.0.1 -U postgres -d postgres -qc 'ALTER SYSTEM SET max_connections = 300' || return 1
    pg_ctlcluster --skip-systemctl-redirect "$ver" main restart || return 1
    for i in $(seq 1 60); do
      pg_isready -q -h 127.0.0.1 -p 5432 && break
      sleep 1
    done
  fi
  local db
  for db in test root; do
    if ! psql -h 127.0.0.1 -U postgres -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
      log "creating database $db"
      psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $db" || return 1
    fi
  done
}
local_url="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
if [ "$ci" = 1 ] && { [ -z "${TEST_DATABASE_URL:-}" ] || [ "$TEST_DATABASE_URL" = "$local_url" ]; }; then
  pg_for_ci || { log "the local PostgreSQL cluster could not be set up"; exit 1; }
  export TEST_DATABASE_URL="$local_url"
fi

# ---- busy mode -------------------------------------------------------------------------
# CPU hogs, one per core by default, each ended by timeout after the suite's own timeout
# at the latest, and killed when this script exits (cleanup).
if [ "$busy" -gt 0 ]; then
  log "busy mode: $busy CPU hogs (at most 70 minutes) while the suite runs"
  for _ in $(seq 1 "$busy"); do
    timeout 70m sh -c 'while :; do :; done' &
    hogs+=("$!")
  done
fi

# ---- checks ----------------------------------------------------------------------------
lint_failed=()
if [ "$lint" = 1 ]; then
  log "go $(go env GOVERSION): gofmt, go vet, staticcheck"
  unformatted="$(gofmt -l . 2>&1)"
  if [ -n "$unformatted" ]; then
    echo "gofmt: these files are not formatted:" >&2
    echo "$unformatted" >&2
    lint_failed+=(gofmt)
  fi
  go vet ./... || lint_failed+=("go vet")
  go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./... || lint_failed+=(staticcheck)
else
  not_run+=("gofmt, go vet, staticcheck: not run (--no-lint)")
fi

# ---- the suite -------------------------------------------------------------------------
# How many test binaries run at once (go test -p). One package's parallel tests use up to
# about 60 connections (the chaos package; the invoice package's eight workers about 35),
# two packages at once up to about 90: two only when the server allows 200 connections or
# more, else one, so that the suite fits in a default server's 100 with room for other
# clients. Without a server the tests start a throwaway cluster per test binary, each
# with room for more. FENCEQ_TEST_P overrides.
suite_server_max_connections() {
  local url="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
  command -v psql >/dev/null 2>&1 || return 1
  PGCONNECT_TIMEOUT=5 psql "$url" -Atc 'SHOW max_connections' 2>/dev/null
}
if [ -n "${FENCEQ_TEST_P:-}" ]; then
  p="$FENCEQ_TEST_P"
  if ! [[ "$p" =~ ^[1-9][0-9]*$ ]]; then
    log "FENCEQ_TEST_P must be a positive number, got '$p'"
    exit 2
  fi
elif maxc="$(suite_server_max_connections)" && [ -n "$maxc" ]; then
  p=1
  [ "$maxc" -ge 200 ] && p=2
  log "the test server allows $maxc connections: test binaries run $p at a time (go test -p $p)"
else
  p=2
fi
out="$(mktemp /tmp/fenceq-test-out.XXXXXX)"
log "go test -race -count=1 -timeout 60m -p $p ./..."
go test -race -count=1 -timeout 60m -p "$p" ./... 2>&1 | tee "$out"
test_rc="${PIPESTATUS[0]}"
stop_hogs

passed="$(grep -cE '^ok[[:space:]]' "$out")"
failed_pkgs="$(grep -E '^FAIL[[:space:]]+[^[:space:]]' "$out" | awk '{print $2}' | sort -u)"
failed=0
[ -n "$failed_pkgs" ] && failed="$(echo "$failed_pkgs" | wc -l)"
notests="$(grep -cE '^\?[[:space:]].*\[no test files\]' "$out")"
rm -f "$out"

echo
echo "test.sh summary:"
echo "  packages: $passed passed, $failed failed ($notests without tests)"
if [ -n "$failed_pkgs" ]; then
  echo "$failed_pkgs" | sed 's/^/  FAIL /'
fi
if [ "$test_rc" -ne 0 ] && [ "$failed" = 0 ]; then
  echo "  go test exited with status $test_rc"
fi
if [ ${#lint_failed[@]} -gt 0 ]; then
  echo "  checks failed: ${lint_failed[*]}"
fi
for n in "${not_run[@]}"; do
  echo "  $n"
done
[ "$busy" -gt 0 ] && echo "  busy mode: CPU hogs beside the suite: $busy"

if [ "$test_rc" -ne 0 ]; then
  exit "$test_rc"
fi
[ ${#lint_failed[@]} -eq 0 ] || exit 1
exit 0
