#!/usr/bin/env bash
# Throwaway Apache Cassandra for kiroku's tests and benchmarks.
#
#   scripts/cassandra.sh start [--nodes N] [--commitlog MODE] [--paxos v1|v2] [--port PORT]
#                              [--heap SIZE] [--yaml 'key: value']...
#       Starts Cassandra 5.0 on Java 17 with its data in a new temporary directory and waits
#       until every node answers CQL (a real STARTUP + QUERY). Prints "DIR CONTACTS" on stdout,
#       CONTACTS being host:port[,host:port...] (one per node, for the driver's host list).
#       --nodes N       1 (default) to 9 nodes; node i listens on 127.0.0.i (Linux routes the
#                       whole 127.0.0.0/8 to lo, no alias needed), all on the same two ports;
#                       the seed is 127.0.0.1. Tokens are evenly spaced (num_tokens: 1), so
#                       the nodes join without bootstrap; use RF <= N.
#       --commitlog     batch | group:WINDOW (e.g. group:10ms) | periodic[:PERIOD] (default
#                       periodic:10000ms, as Cassandra ships): cassandra.yaml commitlog_sync and
#                       commitlog_sync_group_window / commitlog_sync_period. Periodic stays the
#                       default for tests: a throwaway node needs no durability, and a test
#                       waits for no fsync (docs/benchmarks.md). A node that keeps data that
#                       matters needs batch or group (docs/operations.md).
#       --paxos V       paxos_variant, the lightweight transactions' Paxos: v2 (default) or v1
#                       (Cassandra's own default). kiroku makes every write a lightweight
#                       transaction, and v2 needs fewer round trips and less work per write:
#                       on a 2-vCPU machine, 1.7x the conditional writes per second of v1
#                       (docs/benchmarks.md). A --yaml 'paxos_variant: ...' line wins too.
#       --port PORT     CQL native port (default: first free from 19042); the storage (gossip)
#                       port is the first free from 17000. JMX is not started.
#       --heap SIZE     -Xmx per node (default 1g; -Xms512m).
#       --yaml LINE     extra cassandra.yaml line, appended as is (e.g. 'cas_contention_timeout:
#                       5000ms'); do not repeat a key the script writes, except paxos_variant.
#   scripts/cassandra.sh stop [DIR]
#       Stops every node of that cluster (default: the running one) by PID and deletes DIR.
#       Does nothing, successfully, when nothing runs.
#   scripts/cassandra.sh status
#       Prints "DIR CONTACTS" of the running cluster, or exits 1.
#   scripts/cassandra.sh stop-node I [--signal KILL|TERM]
#       Stops node I (1..N) of the running cluster by its PID, for fault tests: SIGKILL
#       (default, a crash: unflushed memtables are replayed from the commit log on restart)
#       or SIGTERM (a drain, some 5 s). Keeps its directory for start-node. Does nothing,
#       successfully, when the node is not running.
#   scripts/cassandra.sh start-node I [J...]
#       Starts the nodes again, together, each on its own directory and configuration (same
#       address, ports, token and data); waits until they answer CQL and until they and every
#       running node see each other UP. Refuses a node that is running, or whose ports
#       another process took while it was down.
#
# One cluster runs per state file: its state (dir, ports, PIDs) is in $KIROKU_CASSANDRA_STATE
# (default ${TMPDIR:-/tmp}/kiroku-cassandra.state), and a second start with the same state
# file is refused; clusters with different state files run side by side. A start chooses
# ports that no other cluster's state (${TMPDIR:-/tmp}/kiroku-cassandra.*/state) names,
# under a machine-wide lock (${TMPDIR:-/tmp}/kiroku-cassandra-ports.lock), so that two starts
# at once, or a start while another cluster's node is stopped, never pick the same ports.
# Cassandra itself (org.apache.cassandra:cassandra-all and its runtime dependencies) is
# resolved once with Maven into ${KIROKU_CACHE:-~/.cache/kiroku}/cassandra-VERSION/lib.
# JVM options: scripts/cassandra/jvm17-server.options. Logs: DIR/nodeI/logs/system.log.
# Start timeout: $CASSANDRA_START_TIMEOUT seconds (default 120) per phase.
# No authentication, loopback only: for tests, never for data that matters.
set -euo pipefail

CASSANDRA_VERSION="${KIROKU_CASSANDRA_VERSION:-5.0.9}"
DEPENDENCY_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KIROKU_CACHE:-$HOME/.cache/kiroku}/cassandra-$CASSANDRA_VERSION"
STATE="${KIROKU_CASSANDRA_STATE:-${TMPDIR:-/tmp}/kiroku-cassandra.state}"
PORTS_LOCK="${TMPDIR:-/tmp}/kiroku-cassandra-ports.lock"
TIMEOUT="${CASSANDRA_START_TIMEOUT:-120}"

log() { echo "cassandra.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# ---------------------------------------------------------------- prerequisites

find_java() {
  local cand v
  for cand in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} "$(command -v java || true)" /usr/lib/jvm/*17*/bin/java; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    v=$("$cand" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2; exit}')
    [ "$v" = "17" ] && { echo "$cand"; return 0; }
  done
  die "Cassandra $CASSANDRA_VERSION runs here on Java 17, and no Java 17 was found (JAVA_HOME, PATH, /usr/lib/jvm); install it: apt-get install -y openjdk-17-jdk-headless"
}

# ensure_lib resolves cassandra-all and its runtime dependencies into $CACHE/lib, once.
ensure_lib() {
  [ -f "$CACHE/lib/.complete" ] && return 0
  command -v mvn >/dev/null || die "Maven (mvn) is needed once to fetch Cassandra $CASSANDRA_VERSION; install it: apt-get install -y maven"
  mkdir -p "$CACHE"
  exec {lock}>"$CACHE/.lock"
  flock "$lock"
  if [ ! -f "$CACHE/lib/.complete" ]; then
    log "resolving org.apache.cassandra:cassandra-all:$CASSANDRA_VERSION with Maven into $CACHE/lib"
    cat >"$CACHE/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kiroku.scripts</groupId>
  <artifactId>cassandra-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>$CASSANDRA_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF
    rm -rf "$CACHE/lib.tmp"
    mvn -B -q -f "$CACHE/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" -DincludeScope=runtime \
      -DoutputDirectory="$CACHE/lib.tmp" >"$CACHE/mvn.log" 2>&1 \
      || { tail -40 "$CACHE/mvn.log" >&2; die "Maven could not resolve Cassandra $CASSANDRA_VERSION (log: $CACHE/mvn.log)"; }
    [ -f "$CACHE/lib.tmp/cassandra-all-$CASSANDRA_VERSION.jar" ] || die "Maven did not produce cassandra-all-$CASSANDRA_VERSION.jar"
    touch "$CACHE/lib.tmp/.complete"
    rm -rf "$CACHE/lib"
    mv "$CACHE/lib.tmp" "$CACHE/lib"
  fi
  exec {lock}>&-
}

# ---------------------------------------------------------------- state

# state_get FILE KEY prints the value of KEY in a state file (lines KEY=VALUE).
state_get() { [ -f "$1" ] || return 0; sed -n "s/^$2=//p" "$1" | tail -1; }

# ours PID DIR: PID is alive and is a JVM started for DIR (guards against PID reuse).
ours() {
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2/"
}

# running_dir prints the dir of the running cluster, if any node of it is alive.
running_dir() {
  local dir pid
  dir=$(state_get "$STATE" dir)
  [ -n "$dir" ] || return 1
  for pid in $(state_get "$dir/state" pids); do ours "$pid" "$dir" && { echo "$dir"; return 0; }; done
  return 1
}

# ---------------------------------------------------------------- CQL probe

# A real CQL exchange over bash's /dev/tcp, native protocol v4: STARTUP must answer READY,
# then a QUERY on system.local must answer RESULT. Prints release_version.
frame() { # opcode body-bytes-as-printf-%b-escapes length
  printf '%b' "\\x04\\x00\\x00\\x01\\x$1$(be32 "$3")$2"
}
be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }
be16() { printf '\\x%02x\\x%02x' $(($1 >> 8 & 255)) $(($1 & 255)); }
cql_string() { printf '%s%s' "$(be16 ${#1})" "$1"; }

# read_frame FD: prints "OPCODE" on line 1 and the body (hex bytes) on line 2.
read_frame() {
  local hdr len
  hdr=($(timeout 5 dd bs=1 count=9 status=none <&"$1" | od -An -tu1 -v)) || return 1
  [ "${#hdr[@]}" -eq 9 ] || return 1
  len=$(((hdr[5] << 24) | (hdr[6] << 16) | (hdr[7] << 8) | hdr[8]))
  echo "${hdr[4]}"
  if [ "$len" -gt 0 ]; then timeout 5 dd bs=1 count="$len" status=none <&"$1" | od -An -tx1 -v | tr -d ' \n'; fi
  echo
}

cql_probe() { # host port
  local fd resp q body
  exec {fd}<>"/dev/tcp/$1/$2" || return 1
  body="$(be16 1)$(cql_string CQL_VERSION)$(cql_string 3.0.0)"
  frame 01 "$body" $((2 + 2 + 11 + 2 + 5)) >&"$fd" || { exec {fd}>&-; return 1; }
  resp=$(read_frame "$fd") || { exec {fd}>&-; return 1; }
  [ "$(head -1 <<<"$resp")" = 2 ] || { exec {fd}>&-; return 1; }   # READY
  q="SELECT release_version FROM system.local"
  body="$(be32 ${#q})$q$(be16 1)\\x00"                               # consistency ONE, no flags
  frame 07 "$body" $((4 + ${#q} + 2 + 1)) >&"$fd" || { exec {fd}>&-; return 1; }
  resp=$(read_frame "$fd") || { exec {fd}>&-; return 1; }
  exec {fd}>&-
  [ "$(head -1 <<<"$resp")" = 8 ] || return 1                        # RESULT
  # The one text value is the body's tail: print its printable characters after the column spec.
  printf '%b' "$(tail -1 <<<"$resp" | sed 's/\(..\)/\\x\1/g')" | tr -c '[:print:]' ' ' | grep -oE '[0-9]+\.[0-9]+\.[0-9]+[^ ]*' | tail -1 || echo "?"
}

# ---------------------------------------------------------------- start

port_in_use() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# claimed PORT: a cluster started by this script (running, or with a node stopped by
# stop-node) names PORT in its state.
claimed() {
  local f
  for f in "${TMPDIR:-/tmp}"/kiroku-cassandra.*/state; do
    [ -f "$f" ] || continue
    [ "$(state_get "$f" native_port)" = "$1" ] || [ "$(state_get "$f" storage_port)" = "$1" ] && return 0
  done
  return 1
}

# free_port FROM HOST... prints the first port >= FROM that is free on every HOST and that
# no other cluster claims.
free_port() {
  local from=$1 p=$1 h busy; shift
  while :; do
    busy=
    claimed "$p" && busy=1
    for h in "$@"; do [ -z "$busy" ] || break; port_in_use "$h" "$p" && busy=1; done
    [ -z "$busy" ] && { echo "$p"; return 0; }
    p=$((p + 1))
    [ "$p" -lt $((from + 200)) ] || die "no free port in $from-$((from + 199))"
  done
}

write_node_conf() { # node-index node-dir token
  local i=$1 nd=$2 token=$3 line
  mkdir -p "$nd"/{conf,data,commitlog,hints,saved_caches,cdc_raw,triggers,logs,tmp}
  {
    cat <<EOF
# Generated by scripts/cassandra.sh for a throwaway test node.
cluster_name: kiroku-test
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
num_tokens: 1
initial_token: $token
auto_bootstrap: false
endpoint_snitch: SimpleSnitch
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:$STORAGE_PORT"
listen_address: 127.0.0.$i
rpc_address: 127.0.0.$i
storage_port: $STORAGE_PORT
start_native_transport: true
native_transport_port: $NATIVE_PORT
data_file_directories:
  - $nd/data
commitlog_directory: $nd/commitlog
hints_directory: $nd/hints
saved_caches_directory: $nd/saved_caches
cdc_raw_directory: $nd/cdc_raw
EOF
    case "$COMMITLOG" in
      batch) echo "commitlog_sync: batch" ;;
      group:*) echo "commitlog_sync: group"; echo "commitlog_sync_group_window: ${COMMITLOG#group:}" ;;
      periodic:*) echo "commitlog_sync: periodic"; echo "commitlog_sync_period: ${COMMITLOG#periodic:}" ;;
    esac
    [ -n "$PAXOS_IN_YAML" ] || echo "paxos_variant: $PAXOS"
    for line in "${EXTRA_YAML[@]}"; do echo "$line"; done
  } >"$nd/conf/cassandra.yaml"
  cat >"$nd/conf/logback.xml" <<EOF
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>$nd/logs/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %logger{0} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
EOF
}

# lock_ports takes the machine-wide lock under which a start chooses its ports and claims
# them in its state file (the JVMs do not inherit it: see launch_node).
lock_ports() {
  exec {PORTS_LOCK_FD}>"$PORTS_LOCK"
  flock -w 60 "$PORTS_LOCK_FD" || die "another start held $PORTS_LOCK for 60 s"
}

launch_node() { # node-index node-dir; runs in a subshell, prints the JVM's PID
  local i=$1 nd=$2 opts=()
  [ -z "${START_LOCK:-}" ] || exec {START_LOCK}>&-
  [ -z "${PORTS_LOCK_FD:-}" ] || exec {PORTS_LOCK_FD}>&-
  mapfile -t opts < <(grep -E '^-' "$HERE/cassandra/jvm17-server.options")
  opts+=(
    "-Xms512m" "-Xmx$HEAP"
    "-XX:ErrorFile=$nd/logs/hs_err_%p.log"
    "-javaagent:$(ls "$CACHE"/lib/jamm-*.jar | head -1)"
    "-Djava.io.tmpdir=$nd/tmp"
    "-Dcassandra.config=file://$nd/conf/cassandra.yaml"
    "-Dlogback.configurationFile=$nd/conf/logback.xml"
    "-Dcassandra.logdir=$nd/logs"
    "-Dcassandra.storagedir=$nd"
    "-Dcassandra.triggers_dir=$nd/triggers"
    "-Dcassandra-foreground=yes"
    # Start fast: no gossip settling wait, no saved ring state (there is none anyway).
    "-Dcassandra.skip_wait_for_gossip_to_settle=0"
    "-Dcassandra.load_ring_state=false"
    "-Dcassandra.ring_delay_ms=$RING_DELAY_MS"
    # On SIGTERM, announce the shutdown to peers for 0.1 s instead of 2 s: stop is for tests.
    "-Dcassandra.shutdown_announce_in_ms=100"
  )
  MALLOC_ARENA_MAX=4 "$JAVA" "${opts[@]}" -cp "$nd/conf:$CACHE/lib/*" \
    org.apache.cassandra.service.CassandraDaemon >"$nd/logs/stdout.log" 2>&1 </dev/null &
  echo $!
}

# wait_cql NODE-INDEX PID NODE-DIR DEADLINE: until the node answers CQL, or fail. The answer
# counts only once the node's own log says it listens on the port: a start racing another
# one can pick the same free port, and the other cluster's node would answer the probe.
wait_cql() {
  local i=$1 pid=$2 nd=$3 deadline=$4 v
  while :; do
    ours "$pid" "$DIR" || { log "node $i (pid $pid) exited during start"; fail_node "$nd"; }
    if grep -qF "Starting listening for CQL clients on /127.0.0.$i:$NATIVE_PORT" "$nd/logs/system.log" 2>/dev/null &&
      ours "$pid" "$DIR" && v=$(cql_probe "127.0.0.$i" "$NATIVE_PORT" 2>/dev/null); then
      log "node $i: Cassandra $v answers CQL on 127.0.0.$i:$NATIVE_PORT after $((SECONDS - T0)) s"
      return 0
    fi
    [ "$SECONDS" -lt "$deadline" ] || { log "node $i did not answer CQL within ${TIMEOUT} s"; fail_node "$nd"; }
    sleep 0.5
  done
}

# wait_up N DEADLINE: until every node's gossip has seen every other node UP.
wait_up() {
  local n=$1 deadline=$2 i j ok
  while :; do
    ok=1
    for i in $(seq 1 "$n"); do
      for j in $(seq 1 "$n"); do
        [ "$i" = "$j" ] && continue
        grep -qE "/127\.0\.0\.$j:$STORAGE_PORT is now UP" "$DIR/node$i/logs/system.log" 2>/dev/null || ok=
      done
    done
    [ -n "$ok" ] && { log "all $n nodes see each other UP after $((SECONDS - T0)) s"; return 0; }
    [ "$SECONDS" -lt "$deadline" ] || { log "nodes did not all see each other UP within ${TIMEOUT} s"; fail_node "$DIR/node1"; }
    sleep 0.5
  done
}

fail_node() {
  local nd=$1
  log "last lines of $nd/logs/system.log:"
  tail -40 "$nd/logs/system.log" >&2 2>/dev/null || true
  if [ -s "$nd/logs/stdout.log" ]; then log "last lines of $nd/logs/stdout.log:"; tail -20 "$nd/logs/stdout.log" >&2; fi
  exit 1   # the EXIT trap stops every node and removes the directory
}

start() {
  local nodes=1 port="" i
  COMMITLOG=periodic:10000ms PAXOS=v2 HEAP=1g EXTRA_YAML=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes="${2:?--nodes needs a count}"; shift 2 ;;
      --commitlog) COMMITLOG="${2:?--commitlog needs a mode}"; shift 2 ;;
      --port) port="${2:?--port needs a port}"; shift 2 ;;
      --heap) HEAP="${2:?--heap needs a size}"; shift 2 ;;
      --paxos) PAXOS="${2:?--paxos needs v1 or v2}"; shift 2 ;;
      --yaml) EXTRA_YAML+=("${2:?--yaml needs a line}"); shift 2 ;;
      --nodes=*|--commitlog=*|--paxos=*|--port=*|--heap=*|--yaml=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
      *) usage ;;
    esac
  done
  [[ "$nodes" =~ ^[1-9]$ ]] || die "--nodes must be 1 to 9"
  case "$COMMITLOG" in
    batch) ;;
    periodic) COMMITLOG=periodic:10000ms ;;
    group:*|periodic:*)
      local d="${COMMITLOG#*:}"
      [[ "$d" =~ ^[0-9]+$ ]] && d="${d}ms"
      [[ "$d" =~ ^[0-9]+(ms|s)$ ]] || die "--commitlog ${COMMITLOG%%:*}:DURATION needs a duration like 10ms or 2s"
      COMMITLOG="${COMMITLOG%%:*}:$d" ;;
    *) die "--commitlog must be batch, group:WINDOW or periodic[:PERIOD]" ;;
  esac
  [[ "$HEAP" =~ ^[0-9]+[mMgG]$ ]] || die "--heap takes a size like 1g or 768m"
  [[ "$PAXOS" =~ ^v[12]$ ]] || die "--paxos must be v1 or v2"
  # A --yaml line that sets paxos_variant wins over --paxos; the script then writes none.
  PAXOS_IN_YAML=
  local line
  for line in "${EXTRA_YAML[@]}"; do
    if [[ "$line" =~ ^[[:space:]]*paxos_variant[[:space:]]*:[[:space:]]*([^[:space:]#]+) ]]; then
      PAXOS_IN_YAML=1 PAXOS=${BASH_REMATCH[1]}
    fi
  done

  # One start at a time (the JVMs do not inherit this lock: see launch_node).
  exec {START_LOCK}>"$STATE.lock"
  flock -n "$START_LOCK" || die "another start is under way ($STATE.lock)"
  local dir
  if dir=$(running_dir); then
    die "a Cassandra cluster already runs ($dir $(state_get "$dir/state" contacts)); stop it first: $0 stop"
  fi
  if [ -n "$(state_get "$STATE" dir)" ]; then
    log "cleaning up after a cluster that is no longer running"; stop >&2
  fi

  JAVA=$(find_java)
  ensure_lib
  lock_ports

  local hosts=()
  for i in $(seq 1 "$nodes"); do hosts+=("127.0.0.$i"); done
  if [ -n "$port" ]; then
    claimed "$port" && die "port $port is claimed by another cluster"
    for i in "${hosts[@]}"; do port_in_use "$i" "$port" && die "port $port is in use on $i"; done
    NATIVE_PORT=$port
  else
    NATIVE_PORT=$(free_port 19042 "${hosts[@]}")
  fi
  STORAGE_PORT=$(free_port 17000 "${hosts[@]}")
  [ "$STORAGE_PORT" != "$NATIVE_PORT" ] || STORAGE_PORT=$(free_port $((NATIVE_PORT + 1)) "${hosts[@]}")
  # RING_DELAY also bounds how long a node waits for gossip and schema from its peers; the
  # default 30 s is for real networks.
  RING_DELAY_MS=$([ "$nodes" -gt 1 ] && echo 5000 || echo 1000)

  DIR=$(mktemp -d "${TMPDIR:-/tmp}/kiroku-cassandra.XXXXXX")
  # Whatever fails from here on leaves no node running and no directory.
  trap 'stop "$DIR" >&2' EXIT
  trap 'exit 130' INT TERM
  local contacts="" pids="" tokens=() t step
  for i in "${hosts[@]}"; do contacts="${contacts:+$contacts,}$i:$NATIVE_PORT"; done
  # Evenly spaced Murmur3 tokens, centred in their ranges: -2^63 + step/2 + k*step.
  step=$(( (9223372036854775807 / nodes) * 2 ))
  t=$(( -9223372036854775807 - 1 + step / 2 ))
  for i in $(seq 1 "$nodes"); do tokens+=("$t"); t=$((t + step)); done
  echo "dir=$DIR" >"$STATE"
  write_state() {
    printf 'dir=%s\nnodes=%s\nnative_port=%s\nstorage_port=%s\ncommitlog=%s\npaxos=%s\nheap=%s\nring_delay_ms=%s\ncontacts=%s\npids=%s\n' \
      "$DIR" "$nodes" "$NATIVE_PORT" "$STORAGE_PORT" "$COMMITLOG" "$PAXOS" "$HEAP" "$RING_DELAY_MS" "$contacts" "$pids" >"$DIR/state"
  }
  write_state
  exec {PORTS_LOCK_FD}>&-   # the ports are claimed

  log "starting $nodes node(s) of Cassandra $CASSANDRA_VERSION in $DIR (CQL port $NATIVE_PORT, storage port $STORAGE_PORT, commitlog $COMMITLOG, paxos $PAXOS)"
  T0=$SECONDS
  local pid
  # The seed first; the others join it together once it answers.
  write_node_conf 1 "$DIR/node1" "${tokens[0]}"
  pid=$(launch_node 1 "$DIR/node1"); pids="$pid"; write_state
  wait_cql 1 "$pid" "$DIR/node1" $((SECONDS + TIMEOUT))
  if [ "$nodes" -gt 1 ]; then
    local deadline=$((SECONDS + TIMEOUT)) npids=("$pid")
    for i in $(seq 2 "$nodes"); do
      write_node_conf "$i" "$DIR/node$i" "${tokens[$((i - 1))]}"
      pid=$(launch_node "$i" "$DIR/node$i"); pids="$pids $pid"; npids+=("$pid"); write_state
    done
    for i in $(seq 2 "$nodes"); do wait_cql "$i" "${npids[$((i - 1))]}" "$DIR/node$i" "$deadline"; done
    wait_up "$nodes" $((SECONDS + TIMEOUT))
  fi
  trap - EXIT INT TERM
  log "up in $((SECONDS - T0)) s; stop with: $0 stop"
  echo "$DIR $contacts"
}

# ---------------------------------------------------------------- stop

stop() {
  local dir="${1:-}" pid pids alive i
  if [ -z "$dir" ]; then
    dir=$(state_get "$STATE" dir)
    [ -n "$dir" ] || { log "no Cassandra cluster running"; return 0; }
  fi
  dir="${dir%/}"
  if [ ! -d "$dir" ]; then
    log "no Cassandra cluster in $dir"
  else
    [ -f "$dir/state" ] || [[ "$(basename "$dir")" == kiroku-cassandra.* ]] \
      || die "$dir was not made by $0; not touching it"
    pids=$(state_get "$dir/state" pids)
    alive=()
    for pid in $pids; do ours "$pid" "$dir" && { kill -TERM "$pid" 2>/dev/null || true; alive+=("$pid"); }; done
    # Cassandra drains on SIGTERM (flushes memtables), some 5 s; the data is thrown away, so
    # don't wait long.
    for i in $(seq 1 100); do
      local any=
      for pid in "${alive[@]}"; do ours "$pid" "$dir" && any=1; done
      [ -z "$any" ] && break
      sleep 0.1
    done
    for pid in "${alive[@]}"; do
      if ours "$pid" "$dir"; then log "node $pid did not stop; killing it"; kill -KILL "$pid" 2>/dev/null || true; fi
    done
    for pid in "${alive[@]}"; do
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    done
    [ "${#alive[@]}" -eq 0 ] || log "stopped ${#alive[@]} node(s): ${alive[*]}"
    rm -rf "$dir"
  fi
  [ "$(state_get "$STATE" dir)" != "$dir" ] || rm -f "$STATE"
}

# ---------------------------------------------------------------- single nodes

# cluster_node I: sets DIR, NATIVE_PORT, STORAGE_PORT, NODES, PIDS (array) from the state of
# the cluster in $STATE, and checks that I names one of its nodes.
cluster_node() {
  DIR=$(state_get "$STATE" dir)
  [ -n "$DIR" ] && [ -f "$DIR/state" ] || die "no Cassandra cluster in $STATE"
  NODES=$(state_get "$DIR/state" nodes)
  NATIVE_PORT=$(state_get "$DIR/state" native_port)
  STORAGE_PORT=$(state_get "$DIR/state" storage_port)
  read -r -a PIDS <<<"$(state_get "$DIR/state" pids)"
  [[ "$1" =~ ^[1-9]$ ]] && [ "$1" -le "$NODES" ] || die "node $1: the cluster has nodes 1 to $NODES"
  [ "${#PIDS[@]}" -eq "$NODES" ] || die "$DIR/state names ${#PIDS[@]} PIDs for $NODES nodes"
}

stop_node() {
  local i="${1:-}" sig=KILL pid n
  shift || usage
  while [ $# -gt 0 ]; do
    case "$1" in
      --signal) sig="${2:?--signal needs KILL or TERM}"; shift 2 ;;
      --signal=*) sig="${1#*=}"; shift ;;
      *) usage ;;
    esac
  done
  case "$sig" in KILL|TERM) ;; *) die "--signal must be KILL or TERM" ;; esac
  cluster_node "$i"
  pid=${PIDS[$((i - 1))]}
  ours "$pid" "$DIR" || { log "node $i is not running"; return 0; }
  kill "-$sig" "$pid"
  # A drain takes some 5 s; past 30 s, kill it.
  for n in $(seq 1 300); do ours "$pid" "$DIR" || break; sleep 0.1; done
  if ours "$pid" "$DIR"; then log "node $i (pid $pid) did not stop on SIG$sig; killing it"; kill -KILL "$pid" 2>/dev/null || true; fi
  for n in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  log "stopped node $i (pid $pid, SIG$sig)"
}

start_node() {
  local i j pid nd want=() peers=() counts=() launched=() deadline ok
  [ $# -gt 0 ] || usage
  for i in "$@"; do
    cluster_node "$i"
    [ -f "$DIR/node$i/conf/cassandra.yaml" ] || die "node $i has no configuration in $DIR/node$i"
    ours "${PIDS[$((i - 1))]}" "$DIR" && die "node $i runs already (pid ${PIDS[$((i - 1))]})"
    want+=("$i")
  done
  exec {START_LOCK}>"$STATE.lock"
  flock -n "$START_LOCK" || die "another start is under way ($STATE.lock)"
  JAVA=$(find_java)
  HEAP=$(state_get "$DIR/state" heap)
  RING_DELAY_MS=$(state_get "$DIR/state" ring_delay_ms)
  [ -n "$HEAP" ] && [ -n "$RING_DELAY_MS" ] || die "$DIR/state lacks heap or ring_delay_ms (a cluster started by an older $0)"
  for i in "${want[@]}"; do
    for j in "$NATIVE_PORT" "$STORAGE_PORT"; do
      port_in_use "127.0.0.$i" "$j" && die "port $j on 127.0.0.$i is taken by another process; node $i cannot start"
    done
  done
  # The running peers must see the nodes UP again: count their log lines now, and look
  # only at what they log after. A restarted node's own log starts afresh.
  for j in $(seq 1 "$NODES"); do
    ours "${PIDS[$((j - 1))]}" "$DIR" || continue
    peers+=("$j"); counts+=("$(wc -l <"$DIR/node$j/logs/system.log")")
  done
  # Whatever fails from here on leaves the nodes stopped.
  trap 'for pid in "${launched[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done' EXIT
  trap 'exit 130' INT TERM
  T0=$SECONDS
  log "starting node(s) ${want[*]} of $DIR again"
  for i in "${want[@]}"; do
    nd="$DIR/node$i"
    [ ! -f "$nd/logs/system.log" ] || mv "$nd/logs/system.log" "$nd/logs/system.log.prev"
    pid=$(launch_node "$i" "$nd")
    launched+=("$pid")
    PIDS[$((i - 1))]=$pid
    sed -i "s/^pids=.*/pids=${PIDS[*]}/" "$DIR/state"
  done
  deadline=$((SECONDS + TIMEOUT))
  for i in "${want[@]}"; do wait_cql "$i" "${PIDS[$((i - 1))]}" "$DIR/node$i" "$deadline"; done
  while :; do
    ok=1
    for i in "${want[@]}"; do
      for j in "${want[@]}" "${peers[@]}"; do
        [ "$i" = "$j" ] || grep -qE "/127\.0\.0\.$j:$STORAGE_PORT is now UP" "$DIR/node$i/logs/system.log" 2>/dev/null || ok=
      done
      for j in "${!peers[@]}"; do
        tail -n +"$((counts[j] + 1))" "$DIR/node${peers[$j]}/logs/system.log" | grep -qE "/127\.0\.0\.$i:$STORAGE_PORT is now UP" || ok=
      done
    done
    [ -n "$ok" ] && break
    [ "$SECONDS" -lt "$deadline" ] || { log "node(s) ${want[*]} and the running ones (${peers[*]}) did not see each other UP within ${TIMEOUT} s"; fail_node "$DIR/node${want[0]}"; }
    sleep 0.5
  done
  trap - EXIT INT TERM
  log "node(s) ${want[*]} up again after $((SECONDS - T0)) s; they and the ${#peers[@]} running node(s) see each other UP"
}

status() {
  local dir
  dir=$(running_dir) || { log "no Cassandra cluster running"; return 1; }
  echo "$dir $(state_get "$dir/state" contacts)"
}

usage() {
  echo "usage: $0 start [--nodes N] [--commitlog batch|group:WINDOW|periodic[:PERIOD]] [--paxos v1|v2] [--port PORT] [--heap SIZE] [--yaml 'key: value']... | stop [DIR] | status | stop-node I [--signal KILL|TERM] | start-node I [J...]" >&2
  exit 2
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "${1:-}" ;;
  status) status ;;
  stop-node) shift; stop_node "$@" ;;
  start-node) shift; start_node "$@" ;;
  *) usage ;;
esac
