#!/usr/bin/env bash
# A real Apache Kafka (KRaft, combined broker+controller) assembled from Maven Central jars.
#
#   kafka.sh fetch                  resolve the jars into deploy/kafka/.cache/<version>/libs (idempotent)
#   kafka.sh start|stop|status|wait single node: PLAINTEXT 127.0.0.1:$KAFKA_PORT, CONTROLLER $KAFKA_CONTROLLER_PORT
#   kafka.sh logs [-f]              the single node's server.log
#   kafka.sh tool NAME args...      a Kafka CLI tool (kafka.sh tool list: the names)
#   kafka.sh cluster start|stop|status|wait    three nodes, 127.0.0.1:29092,39092,49092
#   kafka.sh cluster kill N | start-node N | stop-node N | logs N [-f]
#
# Environment (defaults in brackets):
#   KAFKA_VERSION [pinned below]  KAFKA_LOG4J_VERSION [matching Kafka's own]
#   KAFKA_PORT [9092]  KAFKA_CONTROLLER_PORT [9093]  KAFKA_DATA_DIR [deploy/kafka/.run/single]
#   KAFKA_HEAP_OPTS [-Xms256m -Xmx512m; cluster nodes -Xms128m -Xmx384m]  KAFKA_JVM_OPTS [extra flags]
#   KAFKA_START_TIMEOUT [120 s]  KAFKA_STOP_TIMEOUT [30 s]  KAFKA_CLUSTER_STOP_TIMEOUT [10 s]
#   KAFKA_PYTHON [.venv/bin/python; used by `wait` for a confluent_kafka metadata request]
#   KAFKA_EXTRA_CONFIG [unset; a file of broker properties appended to server.properties, the
#     last value of a key winning: another listener (SASL_SSL, with its keystore and JAAS
#     settings: tests/kafka/secure_broker.py), quotas, ...]
#     (another such file: OAUTHBEARER listeners whose tokens Kafka's unsecured validator checks,
#     for the OIDC token endpoint of tests/kafka/oauth_broker.py)
#
# Data dir layout: server.properties (regenerated each start), server.log, kafka.pid, data/ (log.dirs,
# formatted on first start only). Everything binds to 127.0.0.1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"

# The pinned release: the newest one on Maven Central our client (confluent-kafka 2.16) passes
# its probes with (tests/kafka/test_broker.py; deploy/kafka/README.md has the findings).
KAFKA_VERSION="${KAFKA_VERSION:-4.4.0}"
if [[ -z "${KAFKA_LOG4J_VERSION:-}" ]]; then
  # log4j2 line each Kafka release ships with (it brings log4j-api/-core; we add log4j-slf4j-impl).
  case "$KAFKA_VERSION" in
    # (what kafka-server's POM brings in 4.1.2/4.2.2/4.3.2/4.4.0; 4.0.x has none: 2.24.3 is its tarball's)
    4.4.* | 4.3.* | 4.2.*) KAFKA_LOG4J_VERSION=2.25.5 ;;
    4.1.*) KAFKA_LOG4J_VERSION=2.25.3 ;;
    4.0.*) KAFKA_LOG4J_VERSION=2.24.3 ;;
    *) echo "kafka.sh: no log4j version known for KAFKA_VERSION=$KAFKA_VERSION; set KAFKA_LOG4J_VERSION" >&2
       exit 2 ;;
  esac
fi

CACHE="$HERE/.cache/$KAFKA_VERSION"
LIBS="$CACHE/libs"
STAMP="$CACHE/libs.complete"
RUN="$HERE/.run"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
KAFKA_DATA_DIR="${KAFKA_DATA_DIR:-$RUN/single}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-120}"
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
# combined nodes that lose the controller quorum while shutting down can hang in controlled shutdown;
# SIGKILL is harmless for these dev/test nodes (log recovery on the next start)
KAFKA_CLUSTER_STOP_TIMEOUT="${KAFKA_CLUSTER_STOP_TIMEOUT:-10}"
KAFKA_JVM_OPTS="${KAFKA_JVM_OPTS:-}"
CLUSTER_DIR="$RUN/cluster"

say() { echo "kafka.sh: $*" >&2; }
die() { say "error: $*"; exit 1; }

abs_path() { realpath -m -- "$1"; } # absolute, normalised, need not exist

# ---------------------------------------------------------------------------------------- fetch
libs_complete() {
  [[ -f "$STAMP" ]] || return 1
  local jar
  while IFS= read -r jar; do
    [[ -f "$LIBS/$jar" ]] || return 1
  done <"$STAMP"
  return 0
}

cmd_fetch() {
  command -v java >/dev/null || die "java not on PATH (Kafka $KAFKA_VERSION needs Java 17+)"
  if libs_complete; then
    say "Kafka $KAFKA_VERSION jars already in $LIBS ($(wc -l <"$STAMP") jars); nothing to fetch"
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not on PATH (needed once to fetch the Kafka jars from Maven Central)"
  say "fetching Kafka $KAFKA_VERSION (log4j $KAFKA_LOG4J_VERSION) from Maven Central into $LIBS"
  rm -rf "$LIBS" "$STAMP"
  mkdir -p "$LIBS"
  local t0=$SECONDS
  # (Maven 3.8 prints colour escapes even with -q -B: strip them; errors still fail via pipefail)
  mvn -B -q -f "$HERE/pom.xml" dependency:copy-dependencies \
    -Dkafka.version="$KAFKA_VERSION" -Dlog4j.version="$KAFKA_LOG4J_VERSION" -Dlibs.dir="$LIBS" 2>&1 |
    sed -e $'s/\x1b\\[[0-9;]*m//g' -e '/^[[:space:]]*$/d' >&2 ||
    die "Maven could not fetch Kafka $KAFKA_VERSION (network to Maven Central? KAFKA_VERSION a real release?)"
  ls "$LIBS"/*kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 || die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing in $LIBS"
  # class index: tool names resolve to whichever main class this release has
  local j
  for j in "$LIBS"/*kafka_2.13-*.jar "$LIBS"/*kafka-tools-[0-9]*.jar; do
    if command -v unzip >/dev/null; then unzip -Z1 "$j" '*.class' 2>/dev/null
    else python3 -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$j" | grep '\.class$'
    fi
  done | grep -v '\$' | sed 's/\.class$//; s#/#.#g' | sort -u >"$CACHE/classes.txt"
  (cd "$LIBS" && ls -1 -- *.jar) >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
  say "fetched $(wc -l <"$STAMP") jars ($(du -sh "$LIBS" | cut -f1)) in $((SECONDS - t0)) s"
}

ensure_libs() { libs_complete || cmd_fetch; }

# ---------------------------------------------------------------------------------------- java
tool_java() { # a short-lived JVM with the tools logging config
  # shellcheck disable=SC2086
  java -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2-tools.properties" $KAFKA_JVM_OPTS \
    -cp "$LIBS/*" "$@"
}

# name -> candidate main classes (the first present in this release's jars wins)
tool_classes() {
  case "$1" in
    topics) echo org.apache.kafka.tools.TopicCommand ;;
    consumer-groups) echo org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    share-groups) echo org.apache.kafka.tools.consumer.group.ShareGroupCommand ;;
    groups) echo org.apache.kafka.tools.GroupsCommand ;;
    transactions) echo org.apache.kafka.tools.TransactionsCommand ;;
    console-producer) echo org.apache.kafka.tools.ConsoleProducer kafka.tools.ConsoleProducer ;;
    console-consumer) echo org.apache.kafka.tools.consumer.ConsoleConsumer ;;
    get-offsets) echo org.apache.kafka.tools.GetOffsetShell ;;
    configs) echo org.apache.kafka.tools.ConfigCommand kafka.admin.ConfigCommand ;;
    metadata-quorum) echo org.apache.kafka.tools.MetadataQuorumCommand ;;
    features) echo org.apache.kafka.tools.FeatureCommand ;;
    broker-api-versions) echo org.apache.kafka.tools.BrokerApiVersionsCommand kafka.admin.BrokerApiVersionsCommand ;;
    acls) echo org.apache.kafka.tools.AclCommand kafka.admin.AclCommand ;;
    delete-records) echo org.apache.kafka.tools.DeleteRecordsCommand ;;
    leader-election) echo org.apache.kafka.tools.LeaderElectionCommand ;;
    log-dirs) echo org.apache.kafka.tools.LogDirsCommand ;;
    reassign-partitions) echo org.apache.kafka.tools.reassign.ReassignPartitionsCommand ;;
    dump-log) echo org.apache.kafka.tools.DumpLogSegments kafka.tools.DumpLogSegments ;;
    storage) echo org.apache.kafka.tools.StorageTool kafka.tools.StorageTool ;;
    producer-perf-test) echo org.apache.kafka.tools.ProducerPerformance ;;
    consumer-perf-test) echo org.apache.kafka.tools.ConsumerPerformance ;;
    verifiable-producer) echo org.apache.kafka.tools.VerifiableProducer ;;
    verifiable-consumer) echo org.apache.kafka.tools.VerifiableConsumer ;;
    *) return 1 ;;
  esac
}
TOOL_NAMES="topics consumer-groups share-groups groups transactions console-producer console-consumer
get-offsets configs metadata-quorum features broker-api-versions acls delete-records leader-election
log-dirs reassign-partitions dump-log storage producer-perf-test consumer-perf-test
verifiable-producer verifiable-consumer"

main_class() { # main_class NAME -> the class for this release
  local candidates c
  candidates="$(tool_classes "$1")" || return 1
  for c in $candidates; do
    if grep -qxF "$c" "$CACHE/classes.txt"; then echo "$c"; return 0; fi
  done
  return 1
}

cmd_tool() {
  [[ $# -ge 1 ]] || die "usage: kafka.sh tool NAME args...   (names: kafka.sh tool list)"
  local name="$1"; shift
  if [[ "$name" == list ]]; then echo $TOOL_NAMES | tr ' ' '\n'; return 0; fi
  ensure_libs
  local cls
  if [[ "$name" == *.* ]]; then cls="$name"; else
    cls="$(main_class "$name")" || die "unknown tool '$name' for Kafka $KAFKA_VERSION; known: $(echo $TOOL_NAMES)"
  fi
  exec_tool "$cls" "$@"
}
exec_tool() { local cls="$1"; shift; tool_java "$cls" "$@"; }

# ---------------------------------------------------------------------------------------- nodes
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_of() { # pid_of DIR -> pid if the pid file names a live kafka.Kafka of this DIR
  local dir="$1" pid
  [[ -f "$dir/kafka.pid" ]] || return 1
  pid="$(<"$dir/kafka.pid")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "kafka.Kafka $dir/server.properties" || return 1
  echo "$pid"
}

new_cluster_id() { # 16 random bytes, URL-safe base64 without padding (what StorageTool random-uuid prints)
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* ]] && { echo "$id"; return; }
  done
}

write_props() { # write_props DIR NODE_ID PORT CPORT VOTERS RF
  local dir="$1" id="$2" port="$3" cport="$4" voters="$5" rf="$6" isr=1
  [[ "$rf" -gt 1 ]] && isr=2
  cat >"$dir/server.properties" <<EOF
# generated by deploy/kafka/kafka.sh on each start; edits are overwritten
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$dir/data
num.partitions=$rf
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=$((rf == 1 ? 1 : 3))
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=$((rf == 1 ? 1 : 3))
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
log.cleaner.dedupe.buffer.size=8388608
log.cleaner.threads=1
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=4
EOF
  if [[ -n "${KAFKA_EXTRA_CONFIG:-}" ]]; then
    [[ -r "$KAFKA_EXTRA_CONFIG" ]] || die "KAFKA_EXTRA_CONFIG=$KAFKA_EXTRA_CONFIG: no readable file"
    { echo "# from KAFKA_EXTRA_CONFIG=$KAFKA_EXTRA_CONFIG"; cat "$KAFKA_EXTRA_CONFIG"; } >>"$dir/server.properties"
  fi
  if [[ "$rf" -gt 1 ]]; then
    # faster failure detection for failover tests
    printf 'broker.session.timeout.ms=6000\nbroker.heartbeat.interval.ms=1000\n' >>"$dir/server.properties"
  fi
}

format_if_needed() { # format_if_needed DIR CLUSTER_ID
  local dir="$1" cid="$2"
  if [[ -f "$dir/data/meta.properties" ]]; then return 0; fi
  say "formatting $dir/data (cluster id $cid)"
  mkdir -p "$dir/data"
  tool_java "$(main_class storage)" format -t "$cid" -c "$dir/server.properties" --ignore-formatted \
    >>"$dir/server.log" 2>&1 || { tail -n 20 "$dir/server.log" >&2; die "format of $dir/data failed"; }
}

launch() { # launch DIR HEAP: start kafka.Kafka in the background, detached, pid file written
  local dir="$1" heap="$2"
  # shellcheck disable=SC2086
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$dir/kafka.pid" \
    java $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dkafka.logs.dir="$dir" -Dlog4j2.configurationFile="$HERE/log4j2-server.properties" \
    $KAFKA_JVM_OPTS -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" \
    </dev/null >>"$dir/server.log" 2>&1 &
  local i
  for i in $(seq 1 50); do [[ -s "$dir/kafka.pid" ]] && break; sleep 0.1; done
}

start_node() { # start_node DIR NODE_ID PORT CPORT VOTERS RF HEAP CLUSTER_ID
  local dir="$1" id="$2" port="$3" cport="$4" voters="$5" rf="$6" heap="$7" cid="$8" pid
  if pid="$(pid_of "$dir")"; then
    say "node $id already running (pid $pid, 127.0.0.1:$port)"
    return 0
  fi
  local p
  for p in "$port" "$cport"; do
    port_open "$p" && die "127.0.0.1:$p is already in use by another process (not the broker of $dir); set KAFKA_PORT/KAFKA_CONTROLLER_PORT or stop it"
  done
  mkdir -p "$dir"
  rm -f "$dir/kafka.pid"
  write_props "$dir" "$id" "$port" "$cport" "$voters" "$rf"
  format_if_needed "$dir" "$cid"
  echo "=== $(date -u +%FT%TZ) kafka.sh start (Kafka $KAFKA_VERSION, node $id)" >>"$dir/server.log"
  launch "$dir" "$heap"
  # the pid file is written before the exec of java: give the exec a moment (a loaded machine)
  local i
  for i in $(seq 1 50); do pid="$(pid_of "$dir")" && break; sleep 0.1; done
  pid="$(pid_of "$dir")" || { tail -n 30 "$dir/server.log" >&2; die "node $id did not start (see $dir/server.log)"; }
  say "started node $id (pid $pid) on 127.0.0.1:$port, controller 127.0.0.1:$cport, log $dir/server.log"
}

stop_pids() { # stop_pids DIR...: SIGTERM all at once, SIGKILL whatever is left after the timeout
  local dir pid pids=() dirs=()
  for dir in "$@"; do
    if pid="$(pid_of "$dir")"; then pids+=("$pid"); dirs+=("$dir"); kill -TERM "$pid" 2>/dev/null || true
      say "SIGTERM pid $pid ($dir)"
    else
      say "not running: $dir"; rm -f "$dir/kafka.pid"
    fi
  done
  [[ ${#pids[@]} -gt 0 ]] || return 0
  local deadline=$((SECONDS + KAFKA_STOP_TIMEOUT)) alive
  while :; do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    if [[ $SECONDS -ge $deadline ]]; then
      for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null && { say "pid $pid still alive after ${KAFKA_STOP_TIMEOUT}s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
      done
      sleep 0.5
      break
    fi
    sleep 0.2
  done
  for dir in "${dirs[@]}"; do rm -f "$dir/kafka.pid"; done
  say "stopped"
}

python_bin() {
  if [[ -n "${KAFKA_PYTHON:-}" ]]; then echo "$KAFKA_PYTHON"; return; fi
  if [[ -x "$REPO/.venv/bin/python" ]]; then echo "$REPO/.venv/bin/python"; return; fi
  command -v python3 || true
}

# probe BOOTSTRAP [NODE_IDS...]: 0 when a Metadata request answers and lists every given broker id
# (listed = registered and unfenced). Uses confluent_kafka when importable, else the Java tool.
probe() {
  local bootstrap="$1"; shift
  local py; py="$(python_bin)"
  if [[ -n "$py" ]] && "$py" -c 'import confluent_kafka' 2>/dev/null; then
    "$py" - "$bootstrap" "$@" 2>/dev/null <<'EOF'
import sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1], "log_level": 0})
want = {int(x) for x in sys.argv[2:]}
md = admin.list_topics(timeout=3)
have = set(md.brokers)
sys.exit(0 if have and want <= have else 1)
EOF
  else
    local out
    out="$(tool_java "$(main_class broker-api-versions)" --bootstrap-server "$bootstrap" 2>/dev/null)" || return 1
    local id
    for id in "$@"; do grep -q "(id: $id rack" <<<"$out" || return 1; done
    [[ -n "$out" ]]
  fi
}

# wait_ready BOOTSTRAP "DIRS" NODE_IDS...: poll until ready; fail early when a node process dies
wait_ready() {
  local bootstrap="$1" dirs="$2"; shift 2
  local deadline=$((SECONDS + KAFKA_START_TIMEOUT)) t0=$SECONDS dir host port
  port="${bootstrap##*:}"
  while :; do
    for dir in $dirs; do
      if ! pid_of "$dir" >/dev/null; then
        tail -n 30 "$dir/server.log" >&2 2>/dev/null || true
        die "broker process of $dir is not running (see $dir/server.log)"
      fi
    done
    if port_open "$port" && probe "$bootstrap" "$@"; then
      say "ready: $bootstrap answers metadata requests${*:+ with brokers $*} ($((SECONDS - t0)) s)"
      return 0
    fi
    [[ $SECONDS -lt $deadline ]] || die "not ready after ${KAFKA_START_TIMEOUT}s: $bootstrap (see the server.log of $dirs)"
    sleep 0.5
  done
}

# ---------------------------------------------------------------------------------------- single
single_dir() { abs_path "$KAFKA_DATA_DIR"; }

cmd_start() {
  ensure_libs
  local dir cid; dir="$(single_dir)"
  mkdir -p "$dir"
  if [[ -f "$dir/cluster.id" ]]; then cid="$(<"$dir/cluster.id")"; else cid="$(new_cluster_id)"; echo "$cid" >"$dir/cluster.id"; fi
  start_node "$dir" 1 "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "1@127.0.0.1:$KAFKA_CONTROLLER_PORT" 1 \
    "${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}" "$cid"
  wait_ready "127.0.0.1:$KAFKA_PORT" "$dir" 1
}

cmd_wait() { ensure_libs; wait_ready "127.0.0.1:$KAFKA_PORT" "$(single_dir)" 1; }
cmd_stop() { stop_pids "$(single_dir)"; }

node_status() { # node_status DIR LABEL PORT
  local dir="$1" label="$2" port="$3" pid
  if pid="$(pid_of "$dir")"; then
    local rss; rss="$(awk '/VmRSS/{print $2}' "/proc/$pid/status" 2>/dev/null || echo '?')"
    if port_open "$port"; then
      echo "$label: running, pid $pid, 127.0.0.1:$port, RSS $((rss / 1024)) MiB, data $dir"
    else
      echo "$label: starting (pid $pid, 127.0.0.1:$port not listening yet), data $dir"
    fi
    return 0
  fi
  echo "$label: stopped (data $dir)"
  return 3
}

cmd_status() { node_status "$(single_dir)" "kafka $KAFKA_VERSION" "$KAFKA_PORT"; }

cmd_logs() {
  local dir; dir="$(single_dir)"
  [[ -f "$dir/server.log" ]] || die "no log yet: $dir/server.log"
  if [[ "${1:-}" == -f ]]; then exec tail -n 100 -F "$dir/server.log"; fi
  tail -n "${1:-200}" "$dir/server.log"
}

# ---------------------------------------------------------------------------------------- cluster
NODES=(1 2 3)
CLUSTER_VOTERS="1@127.0.0.1:29093,2@127.0.0.1:39093,3@127.0.0.1:49093"
CLUSTER_BOOTSTRAP="127.0.0.1:29092,127.0.0.1:39092,127.0.0.1:49092"
node_port() { echo "$(($1 + 1))9092"; }
node_cport() { echo "$(($1 + 1))9093"; }
node_dir() { echo "$CLUSTER_DIR/node$1"; }
check_node() { [[ "${1:-}" =~ ^[123]$ ]] || die "node must be 1, 2 or 3 (got '${1:-}')"; }

cluster_id() {
  mkdir -p "$CLUSTER_DIR"
  [[ -f "$CLUSTER_DIR/cluster.id" ]] || new_cluster_id >"$CLUSTER_DIR/cluster.id"
  cat "$CLUSTER_DIR/cluster.id"
}

cluster_start_node() { # no waiting
  local n="$1"
  start_node "$(node_dir "$n")" "$n" "$(node_port "$n")" "$(node_cport "$n")" "$CLUSTER_VOTERS" 3 \
    "${KAFKA_HEAP_OPTS:--Xms128m -Xmx384m}" "$(cluster_id)"
}

cmd_cluster() {
  local sub="${1:-}"; shift || true
  case "$sub" in
    start)
      ensure_libs
      local n dirs=""
      # all three first, then wait: a lone combined node cannot elect a controller (needs 2 of 3)
      for n in "${NODES[@]}"; do cluster_start_node "$n"; dirs+=" $(node_dir "$n")"; done
      wait_ready "$CLUSTER_BOOTSTRAP" "$dirs" "${NODES[@]}"
      echo "bootstrap: $CLUSTER_BOOTSTRAP"
      ;;
    wait)
      ensure_libs
      wait_ready "$CLUSTER_BOOTSTRAP" "$(for n in "${NODES[@]}"; do node_dir "$n"; done)" "${NODES[@]}" ;;
    stop) KAFKA_STOP_TIMEOUT="$KAFKA_CLUSTER_STOP_TIMEOUT" stop_pids "$(node_dir 1)" "$(node_dir 2)" "$(node_dir 3)" ;;
    status)
      local n rc=0
      for n in "${NODES[@]}"; do node_status "$(node_dir "$n")" "node $n" "$(node_port "$n")" || rc=3; done
      return $rc ;;
    kill)
      check_node "${1:-}"
      local pid
      pid="$(pid_of "$(node_dir "$1")")" || die "node $1 is not running"
      kill -KILL "$pid"
      say "SIGKILL node $1 (pid $pid)"
      local i; for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$(node_dir "$1")/kafka.pid" ;;
    start-node)
      check_node "${1:-}"
      ensure_libs
      cluster_start_node "$1"
      wait_ready "$CLUSTER_BOOTSTRAP" "$(node_dir "$1")" "$1" ;;
    stop-node) check_node "${1:-}"; KAFKA_STOP_TIMEOUT="$KAFKA_CLUSTER_STOP_TIMEOUT" stop_pids "$(node_dir "$1")" ;;
    logs)
      check_node "${1:-}"
      local f; f="$(node_dir "$1")/server.log"
      [[ -f "$f" ]] || die "no log yet: $f"
      if [[ "${2:-}" == -f ]]; then exec tail -n 100 -F "$f"; fi
      tail -n 200 "$f" ;;
    *) die "usage: kafka.sh cluster start|stop|status|wait|kill N|start-node N|stop-node N|logs N [-f]" ;;
  esac
}

# ---------------------------------------------------------------------------------------- main
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; }

cmd="${1:-}"; shift || true
case "$cmd" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  wait) cmd_wait ;;
  logs) cmd_logs "$@" ;;
  tool) cmd_tool "$@" ;;
  cluster) cmd_cluster "$@" ;;
  version) echo "$KAFKA_VERSION" ;;
  help | -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
