# Sourced by scripts/test and deploy/check: make sure the services the tests
# talk to are up (Postgres on 127.0.0.1:5432, NATS with JetStream on
# 127.0.0.1:4222), starting them — installing Debian's packages first if
# needed — when they are not. Needs `root` and `state` set by the caller.
# Override the endpoints with FLOWER_TEST_DATABASE_URL / FLOWER_TEST_NATS_URL
# (then nothing is started).
say() { printf '%s: %s\n' "${FLOWER_SCRIPT:-services}" "$*" >&2; }
die() { say "$*"; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"
  else return 1; fi
}
apt_install() {
  command -v apt-get >/dev/null || return 1
  say "installing $* from Debian's packages"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 ||
    { as_root apt-get update -q >/dev/null 2>&1 && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
}
wait_for_port() {
  for _ in $(seq 1 100); do listening "$1" && return 0; sleep 0.1; done
  return 1
}

ensure_postgres() {
  [ -n "${FLOWER_TEST_DATABASE_URL:-}" ] && return 0
  listening 5432 && return 0
  say "Postgres is not listening on 127.0.0.1:5432; starting one"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql/*/main >/dev/null 2>&1; then
    as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start 2>/dev/null || true
    wait_for_port 5432 && return 0
  fi
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$bin" ]; then
    apt_install postgresql || die "Postgres is missing and cannot be installed here (needs root or sudo, and apt-get): install PostgreSQL, or set FLOWER_TEST_DATABASE_URL"
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  local data="$state/pg" run=()
  mkdir -p "$state"
  # initdb refuses to run as root: use the postgres account when we are root.
  if [ "$(id -u)" = 0 ]; then id postgres >/dev/null 2>&1 || die "no postgres user to run the server as"; run=(runuser -u postgres --); chown postgres "$state"; fi
  if [ ! -f "$data/PG_VERSION" ]; then
    "${run[@]}" "$bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null
  fi
  "${run[@]}" "$bin/pg_ctl" -D "$data" -l "$state/pg.log" -o "-p 5432 -c listen_addresses=127.0.0.1 -k /tmp" start >/dev/null
  wait_for_port 5432 || die "Postgres did not start (see $state/pg.log)"
}

ensure_nats() {
  [ -n "${FLOWER_TEST_NATS_URL:-}" ] && return 0
  listening 4222 && return 0
  say "NATS is not listening on 127.0.0.1:4222; starting one with JetStream"
  local bin
  bin=$(command -v nats-server || ls /usr/sbin/nats-server 2>/dev/null || true)
  if [ -z "$bin" ]; then
    apt_install nats-server || die "nats-server is missing and cannot be installed here (needs root or sudo, and apt-get): install it, or set FLOWER_TEST_NATS_URL"
    bin=$(command -v nats-server || echo /usr/sbin/nats-server)
  fi
  mkdir -p "$state/nats"
  nohup "$bin" -a 127.0.0.1 -p 4222 -js -sd "$state/nats" >"$state/nats.log" 2>&1 &
  wait_for_port 4222 || die "NATS did not start (see $state/nats.log)"
}


# The web console's browser test drives Debian's Chromium through its
# ChromeDriver: install both when missing.
ensure_chromium() {
  if [ -x /usr/lib/chromium/chromium ] && command -v chromedriver >/dev/null; then
    return 0
  fi
  apt_install chromium chromium-driver ||
    die "chromium and chromium-driver are missing and cannot be installed here (needs root or sudo, and apt-get): install them for the console's browser test"
}

# The escape suite (tests/e2e/isolation.rs) probes from inside jobs with
# python3 and curl; the launcher brings a namespace's loopback up with `ip`
# (iproute2) for egress; setpriv (util-linux) runs it as another user.
ensure_probe_tools() {
  local missing=()
  command -v python3 >/dev/null || missing+=(python3)
  command -v curl >/dev/null || missing+=(curl)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v setpriv >/dev/null || missing+=(util-linux)
  [ ${#missing[@]} -eq 0 ] && return 0
  apt_install "${missing[@]}" ||
    die "${missing[*]} missing and cannot be installed here (needs root or sudo, and apt-get): the escape suite needs them"
}

# The MCP server's end-to-end test (tests/e2e/mcp_serve.rs) is driven by the
# Python MCP SDK from PyPI, in a venv of its own under target/flower-services/;
# installed once, then reused. Exports FLOWER_TEST_MCP_PYTHON (the venv's python).
FLOWER_MCP_SDK_VERSION=2.3.0
ensure_python_mcp() {
  local venv="$state/mcp-venv"
  export FLOWER_TEST_MCP_PYTHON="$venv/bin/python"
  if [ -x "$venv/bin/python" ] &&
    [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" = "$FLOWER_MCP_SDK_VERSION" ]; then
    return 0
  fi
  command -v python3 >/dev/null || apt_install python3 python3-venv ||
    die "python3 is missing and cannot be installed here: install Python 3.10+ with venv for the MCP server's test"
  mkdir -p "$state"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    apt_install python3-venv && rm -rf "$venv" && python3 -m venv "$venv" ||
      die "python3 -m venv failed (install Debian's python3-venv) for the MCP server's test"
  fi
  say "installing the Python MCP SDK (mcp==$FLOWER_MCP_SDK_VERSION) into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "mcp==$FLOWER_MCP_SDK_VERSION" ||
    die "pip could not install mcp==$FLOWER_MCP_SDK_VERSION (PyPI unreachable?) for the MCP server's test"
}
