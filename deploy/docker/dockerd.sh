# Sourced by deploy/docker/build-offline and deploy/smoke: make a Docker engine
# reachable. One already answering (DOCKER_HOST or the default socket) is
# used as it is; otherwise Debian's dockerd (package docker.io, installed when
# missing) is started here, on a socket of its own, and stopped by its PID
# when the calling script exits (flower_dockerd_stop, from its EXIT trap).
# Needs root (or sudo) to start an engine.

flower_dockerd_pid=""
flower_dockerd_run=""

flower_docker_ensure() {
  local state="$1"
  if docker info >/dev/null 2>&1; then return 0; fi
  local as=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null && sudo -n true 2>/dev/null || {
      echo "no Docker engine answers and starting one needs root (or sudo)" >&2; return 1; }
    as=(sudo -n)
  fi
  if ! command -v dockerd >/dev/null; then
    echo "installing Debian's docker.io" >&2
    "${as[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null 2>&1 ||
      { "${as[@]}" apt-get update -q >/dev/null 2>&1 &&
        "${as[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null; } || return 1
  fi
  mkdir -p "$state"
  # Socket paths are short (sun_path holds 108 bytes): the engine's runtime
  # state goes under /tmp, its log and pid file under $state.
  local run
  run=$(mktemp -d /tmp/flower-dockerd.XXXXXX)
  flower_dockerd_run="$run"
  export DOCKER_HOST="unix://$run/docker.sock"
  "${as[@]}" dockerd --host "$DOCKER_HOST" --pidfile "$run/dockerd.pid" \
    --exec-root "$run/exec" --data-root /var/lib/docker >"$state/dockerd.log" 2>&1 &
  flower_dockerd_pid=$!
  for _ in $(seq 1 150); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$flower_dockerd_pid" 2>/dev/null || break
    sleep 0.2
  done
  echo "dockerd did not start (see $state/dockerd.log):" >&2
  tail -5 "$state/dockerd.log" >&2
  return 1
}

flower_dockerd_stop() {
  [ -n "$flower_dockerd_pid" ] || return 0
  kill "$flower_dockerd_pid" 2>/dev/null || true
  for _ in $(seq 1 300); do kill -0 "$flower_dockerd_pid" 2>/dev/null || break; sleep 0.1; done
  flower_dockerd_pid=""
  if [ -n "$flower_dockerd_run" ]; then
    # The engine leaves its network namespace file mounted.
    grep -o " $flower_dockerd_run/[^ ]*" /proc/mounts 2>/dev/null | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$flower_dockerd_run" 2>/dev/null || true
  fi
  flower_dockerd_run=""
}
