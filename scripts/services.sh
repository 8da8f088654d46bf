#!/usr/bin/env bash
# services.sh — the real backing services Sluice's tests and `make run` use:
# Apache Kafka (KRaft, one combined broker+controller), ClickHouse, Redis and
# Alertmanager. Everything listens on loopback on non-default ports, and all
# data, logs, pid files and downloaded artifacts live under one folder
# ($SLUICE_SERVICES_DIR, default .services/ in the repository).
#
#   scripts/services.sh up [kafka|clickhouse|redis|alertmanager ...]
#   scripts/services.sh down | status | logs [service] | env | install | reset
#
# `up` is idempotent: a service already answering is reused, a missing package
# or jar is installed first (apt-get, Maven Central), so a fresh Debian machine
# needs nothing by hand. Readiness failures name the service and its log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${SLUICE_SERVICES_DIR:-$ROOT/.services}
LOG=$DIR/log
RUN=$DIR/run
CACHE=$DIR/cache

# Ports: overridable, all non-default so a developer's own services are left alone.
KAFKA_PORT=${SLUICE_KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${SLUICE_KAFKA_CONTROLLER_PORT:-19094}
CLICKHOUSE_PORT=${SLUICE_CLICKHOUSE_PORT:-19000}
CLICKHOUSE_HTTP_PORT=${SLUICE_CLICKHOUSE_HTTP_PORT:-18123}
REDIS_PORT=${SLUICE_REDIS_PORT:-16379}
ALERTMANAGER_PORT=${SLUICE_ALERTMANAGER_PORT:-19093}
READY_TIMEOUT=${SLUICE_READY_TIMEOUT:-120}

ALL_SERVICES=(kafka clickhouse redis alertmanager)

say() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pid_alive() {
	local f=$RUN/$1.pid
	[[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

# wait_ready NAME LOGFILE CHECK...: polls CHECK until it succeeds or the
# timeout passes, and fails naming the service and the log to read.
wait_ready() {
	local name=$1 logfile=$2
	shift 2
	local deadline=$((SECONDS + READY_TIMEOUT))
	until "$@" >/dev/null 2>&1; do
		if ! pid_alive "$name"; then
			tail -n 30 "$logfile" >&2 2>/dev/null || true
			die "$name exited during start-up; read $logfile"
		fi
		((SECONDS < deadline)) || die "$name not ready after ${READY_TIMEOUT}s; read $logfile"
		sleep 0.5
	done
	say "$name ready"
}

apt_install() {
	local missing=()
	for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
	((${#missing[@]} == 0)) && return 0
	[[ $(id -u) == 0 ]] || die "missing Debian packages ${missing[*]}: run as root or apt-get install them"
	say "installing ${missing[*]} (apt-get)"
	if [[ ! -f $CACHE/.apt-updated ]]; then
		apt-get update -qq >&2 || die "apt-get update failed"
		mkdir -p "$CACHE" && touch "$CACHE/.apt-updated"
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		die "apt-get install ${missing[*]} failed"
}

kafka_libs() { echo "$CACHE/kafka-libs"; }

install_kafka() {
	command -v java >/dev/null || apt_install openjdk-17-jre-headless
	command -v mvn >/dev/null || apt_install maven
	local libs stamp
	libs=$(kafka_libs)
	stamp=$libs/.pom-$(sha256sum "$ROOT/deploy/kafka/pom.xml" | cut -c1-16)
	[[ -f $stamp ]] && return 0
	say "resolving Kafka jars from Maven Central into $libs"
	rm -rf "$libs" && mkdir -p "$libs"
	mvn -q -B -f "$ROOT/deploy/kafka/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$libs" >"$LOG/kafka-maven.log" 2>&1 ||
		die "Maven could not resolve Kafka; read $LOG/kafka-maven.log"
	touch "$stamp"
}

install_tools() {
	case $1 in
	kafka) install_kafka ;;
	clickhouse) apt_install clickhouse-server clickhouse-client ;;
	redis) apt_install redis-server ;;
	alertmanager) apt_install prometheus-alertmanager ;;
	esac
}

start_kafka() {
	local d=$DIR/kafka props
	props=$d/server.properties
	mkdir -p "$d/data"
	cat >"$props" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$d/data
num.partitions=4
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=168
EOF
	local cp="$(kafka_libs)/*"
	local jopts=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
		-Dkafka.logs.dir="$LOG" -Dlog4j2.configurationFile="$ROOT/deploy/kafka/log4j2.properties")
	if [[ ! -f $d/data/meta.properties ]]; then
		local id
		id=$(java "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool random-uuid 2>>"$LOG/kafka.out")
		java "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool format --standalone -t "$id" -c "$props" \
			>>"$LOG/kafka.out" 2>&1 || die "formatting Kafka storage failed; read $LOG/kafka.out"
	fi
	: >"$LOG/kafka.log" # readiness greps this log: start it empty
	setsid nohup java "${jopts[@]}" -cp "$cp" kafka.Kafka "$props" >>"$LOG/kafka.out" 2>&1 </dev/null &
	echo $! >"$RUN/kafka.pid"
	wait_ready kafka "$LOG/kafka.log" kafka_ready
}

kafka_ready() {
	port_open "$KAFKA_PORT" && grep -q "Kafka Server started" "$LOG/kafka.log"
}

start_clickhouse() {
	local d=$DIR/clickhouse
	mkdir -p "$d"/{data,tmp,user_files,format_schemas,log,conf}
	sed -e "s#@DATA@#$d#g" -e "s#@CONF@#$d/conf#g" \
		-e "s#@TCP_PORT@#$CLICKHOUSE_PORT#g" -e "s#@HTTP_PORT@#$CLICKHOUSE_HTTP_PORT#g" \
		"$ROOT/deploy/clickhouse/config.xml" >"$d/conf/config.xml"
	cp "$ROOT/deploy/clickhouse/users.xml" "$d/conf/users.xml"
	ln -sf "$d/log/clickhouse-server.err.log" "$LOG/clickhouse.log"
	(cd "$d" && exec setsid nohup clickhouse-server --config-file="$d/conf/config.xml" \
		>>"$LOG/clickhouse.out" 2>&1 </dev/null) &
	echo $! >"$RUN/clickhouse.pid"
	wait_ready clickhouse "$LOG/clickhouse.out" \
		clickhouse-client --host 127.0.0.1 --port "$CLICKHOUSE_PORT" --query "SELECT 1"
}

start_redis() {
	local d=$DIR/redis
	mkdir -p "$d"
	# No persistence: the enforcer owns the flag state and rewrites it after a
	# Redis restart, which is exactly what the tests exercise.
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
		--pidfile "$RUN/redis.pid" --logfile "$LOG/redis.log" --dir "$d" \
		--save "" --appendonly no --protected-mode yes ||
		die "redis-server failed to start; read $LOG/redis.log"
	local i
	for i in $(seq 50); do [[ -s $RUN/redis.pid ]] && break; sleep 0.1; done
	wait_ready redis "$LOG/redis.log" redis-cli -p "$REDIS_PORT" ping
}

start_alertmanager() {
	local d=$DIR/alertmanager
	mkdir -p "$d/data"
	setsid nohup prometheus-alertmanager --config.file="$ROOT/deploy/alertmanager/alertmanager.yml" \
		--storage.path="$d/data" --web.listen-address="127.0.0.1:$ALERTMANAGER_PORT" \
		--cluster.listen-address= >>"$LOG/alertmanager.log" 2>&1 </dev/null &
	echo $! >"$RUN/alertmanager.pid"
	wait_ready alertmanager "$LOG/alertmanager.log" alertmanager_ready
}

alertmanager_ready() {
	port_open "$ALERTMANAGER_PORT" || return 1
	exec 3<>"/dev/tcp/127.0.0.1/$ALERTMANAGER_PORT"
	printf 'GET /-/ready HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
	local status
	read -r _ status _ <&3 || return 1
	exec 3>&-
	[[ $status == 200 ]]
}

service_port() {
	case $1 in
	kafka) echo "$KAFKA_PORT" ;;
	clickhouse) echo "$CLICKHOUSE_PORT" ;;
	redis) echo "$REDIS_PORT" ;;
	alertmanager) echo "$ALERTMANAGER_PORT" ;;
	*) die "unknown service '$1' (known: ${ALL_SERVICES[*]})" ;;
	esac
}

up_one() {
	local s=$1 port
	port=$(service_port "$s")
	if pid_alive "$s" && port_open "$port"; then
		say "$s already running on 127.0.0.1:$port (reused)"
		return 0
	fi
	if port_open "$port"; then
		die "port $port for $s is taken by a process this script did not start; stop it or set SLUICE_${s^^}_PORT"
	fi
	install_tools "$s"
	say "starting $s on 127.0.0.1:$port"
	"start_$s"
}

stop_one() {
	local s=$1 f=$RUN/$1.pid pid
	[[ -f $f ]] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		say "stopping $s (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		local i
		for i in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
		if kill -0 "$pid" 2>/dev/null; then
			say "$s did not stop in 30s; killing"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$f"
}

# Processes whose command line points into our folder, whatever their pid
# files say: the backstop that makes `down` leave nothing behind.
leftovers() { pgrep -f -- "$DIR/" || true; }

# install_test_tools installs what tests need besides the services: kcat,
# a librdkafka producer, for the aggregator's direct-producer test (a
# partitioner other than the Go clients', see docs/producers.md).
install_test_tools() {
	command -v kcat >/dev/null || apt_install kcat
}

cmd_up() {
	mkdir -p "$LOG" "$RUN" "$CACHE"
	local s
	for s in "${@:-${ALL_SERVICES[@]}}"; do up_one "$s"; done
	install_test_tools
	cmd_env
}

cmd_down() {
	local s
	for s in "${ALL_SERVICES[@]}"; do stop_one "$s"; done
	local left
	left=$(leftovers)
	if [[ -n $left ]]; then
		say "killing leftover processes: $left"
		kill -KILL $left 2>/dev/null || true
	fi
}

cmd_status() {
	local s port rc=0
	for s in "${ALL_SERVICES[@]}"; do
		port=$(service_port "$s")
		if pid_alive "$s" && port_open "$port"; then
			printf '%-13s up    127.0.0.1:%s (pid %s)\n' "$s" "$port" "$(cat "$RUN/$s.pid")"
		else
			printf '%-13s down\n' "$s"
			rc=1
		fi
	done
	return $rc
}

cmd_logs() {
	local s=${1:-}
	if [[ -z $s ]]; then
		ls -1 "$LOG"
		return
	fi
	service_port "$s" >/dev/null
	tail -n 100 "$LOG/$s.log"
}

# env prints the addresses in the SLUICE_* variables the services and tests read.
cmd_env() {
	cat <<EOF
SLUICE_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
SLUICE_CLICKHOUSE_ADDR=127.0.0.1:$CLICKHOUSE_PORT
SLUICE_REDIS_ADDR=127.0.0.1:$REDIS_PORT
SLUICE_ALERTMANAGER_URL=http://127.0.0.1:$ALERTMANAGER_PORT
EOF
}

case ${1:-} in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
status) cmd_status ;;
logs) shift; cmd_logs "$@" ;;
env) cmd_env ;;
install)
	shift
	mkdir -p "$LOG" "$CACHE"
	for s in "${@:-${ALL_SERVICES[@]}}"; do install_tools "$s"; done
	install_test_tools
	;;
reset) cmd_down; rm -rf "$DIR"/{kafka,clickhouse,redis,alertmanager,log,run} ;;
*)
	sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
