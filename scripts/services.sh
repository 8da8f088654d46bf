#!/usr/bin/env bash
# services.sh — the real backing services Sluice's tests and `make run` use:
# Apache Kafka (KRaft, one combined broker+controller), ClickHouse, Redis, a
# 3-master Redis Cluster and Alertmanager; and the engines run as clusters
# (docs/scaling.md): ZooKeeper with two replicated ClickHouse 18.16 servers,
# three Kafka brokers, a Redis Cluster with a replica per master, and a Redis
# primary with a replica under three Sentinels. Everything listens on
# loopback on non-default ports, and all data, logs, pid files and
# downloaded artifacts live under one folder ($SLUICE_SERVICES_DIR, default
# .services/ in the repository).
#
#   scripts/services.sh up [kafka|clickhouse|redis|redis-cluster|alertmanager|
#                           zookeeper|clickhouse-cluster|kafka-cluster|redis-ha|redis-sentinel ...]
#   scripts/services.sh down | status | logs [service] | env | install [service|nginx ...] | reset
#
# `up` and `install` also install the tools tests start themselves (kcat,
# nginx; see install_test_tools).
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
# Generated on first use, never committed: the test CA and server
# certificate, and the passwords of the SCRAM and Redis ACL users.
SECRETS=$DIR/secrets
KAFKA_SCRAM_USER=sluice
REDIS_ACL_USER=sluice

# Ports: overridable, all non-default so a developer's own services are left alone.
KAFKA_PORT=${SLUICE_KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${SLUICE_KAFKA_CONTROLLER_PORT:-19094}
# A second Kafka listener, SASL_PLAINTEXT with SCRAM-SHA-512, for the tests of
# the clients' SASL options; 19092 stays plaintext for everything else.
KAFKA_SASL_PORT=${SLUICE_KAFKA_SASL_PORT:-19095}
CLICKHOUSE_PORT=${SLUICE_CLICKHOUSE_PORT:-19000}
CLICKHOUSE_HTTP_PORT=${SLUICE_CLICKHOUSE_HTTP_PORT:-18123}
REDIS_PORT=${SLUICE_REDIS_PORT:-16379}
# The same redis-server also listens with TLS here (self-signed CA below).
REDIS_TLS_PORT=${SLUICE_REDIS_TLS_PORT:-16380}
# A Redis Cluster of three masters (no replicas) on three consecutive ports
# from this one; each node's cluster bus is its port + 10000.
REDIS_CLUSTER_PORT=${SLUICE_REDIS_CLUSTER_PORT:-17001}
REDIS_CLUSTER_PORTS=("$REDIS_CLUSTER_PORT" "$((REDIS_CLUSTER_PORT + 1))" "$((REDIS_CLUSTER_PORT + 2))")
ALERTMANAGER_PORT=${SLUICE_ALERTMANAGER_PORT:-19093}
# The engine clusters (docs/scaling.md), each on ports of its own:
# ZooKeeper for the replicated ClickHouse (18.16 has no ClickHouse Keeper);
ZOOKEEPER_PORT=${SLUICE_ZOOKEEPER_PORT:-12181}
# two ClickHouse servers, native protocol on these two consecutive ports,
# HTTP on port - 1000 and interserver (replication) on port + 10;
CLICKHOUSE_CLUSTER_PORT=${SLUICE_CLICKHOUSE_CLUSTER_PORT:-19201}
CLICKHOUSE_CLUSTER_PORTS=("$CLICKHOUSE_CLUSTER_PORT" "$((CLICKHOUSE_CLUSTER_PORT + 1))")
# three combined KRaft broker+controllers, clients on these three ports,
# the controller listeners on port + 10;
KAFKA_CLUSTER_PORT=${SLUICE_KAFKA_CLUSTER_PORT:-19101}
KAFKA_CLUSTER_PORTS=("$KAFKA_CLUSTER_PORT" "$((KAFKA_CLUSTER_PORT + 1))" "$((KAFKA_CLUSTER_PORT + 2))")
# a Redis Cluster of three masters and three replicas on six ports (bus +10000);
REDIS_HA_PORT=${SLUICE_REDIS_HA_PORT:-17101}
REDIS_HA_PORTS=()
for ((i = 0; i < 6; i++)); do REDIS_HA_PORTS+=("$((REDIS_HA_PORT + i))"); done
# a Redis primary on this port, its replica on port + 1, and three Sentinels
# watching them (master name sluice) on SENTINEL_PORT .. + 2.
REDIS_SENTINEL_DATA_PORT=${SLUICE_REDIS_SENTINEL_DATA_PORT:-16479}
REDIS_SENTINEL_DATA_PORTS=("$REDIS_SENTINEL_DATA_PORT" "$((REDIS_SENTINEL_DATA_PORT + 1))")
REDIS_SENTINEL_PORT=${SLUICE_REDIS_SENTINEL_PORT:-26479}
REDIS_SENTINEL_PORTS=("$REDIS_SENTINEL_PORT" "$((REDIS_SENTINEL_PORT + 1))" "$((REDIS_SENTINEL_PORT + 2))")
REDIS_SENTINEL_MASTER=sluice
# The nginx binary the forward-auth tests start (install_test_tools).
NGINX_BIN=${SLUICE_NGINX_BIN:-/usr/sbin/nginx}
READY_TIMEOUT=${SLUICE_READY_TIMEOUT:-120}

ALL_SERVICES=(kafka clickhouse redis redis-cluster alertmanager zookeeper clickhouse-cluster kafka-cluster redis-ha redis-sentinel)
# Services made of several processes, each with a pid file NAME-PORT.pid.
MULTI_SERVICES=(clickhouse-cluster kafka-cluster redis-ha redis-sentinel)

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
	local missing=() p
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

# secret NAME: prints the password in $SECRETS/NAME, generating it first.
secret() {
	local f=$SECRETS/$1
	if [[ ! -s $f ]]; then
		command -v openssl >/dev/null || apt_install openssl
		mkdir -p "$SECRETS" && chmod 700 "$SECRETS"
		(umask 077 && openssl rand -hex 16 >"$f") || die "openssl could not generate $f"
	fi
	cat "$f"
}

# ensure_certs: a self-signed CA and a server certificate for 127.0.0.1 and
# localhost, made once with openssl; Redis serves it on its TLS port and the
# tests trust the CA.
ensure_certs() {
	local t=$SECRETS/tls
	[[ -s $t/ca.pem && -s $t/server.pem && -s $t/server-key.pem ]] && return 0
	command -v openssl >/dev/null || apt_install openssl
	mkdir -p "$t" && chmod 700 "$SECRETS" "$t"
	say "generating a test CA and server certificate in $t"
	(
		cd "$t" && umask 077
		openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=sluice test CA" \
			-keyout ca-key.pem -out ca.pem
		openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server-key.pem -out server.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
		openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -days 3650 \
			-extfile server.ext -out server.pem
		rm -f server.csr server.ext
	) >>"$LOG/openssl.log" 2>&1 || die "openssl could not make the test certificates; read $LOG/openssl.log"
}

# install_jars LABEL POM LIBS resolves the jars of the Maven project POM
# into the folder LIBS, once per content of POM (a stamp of its hash),
# installing Java and Maven first when they are missing.
install_jars() {
	local label=$1 pom=$2 libs=$3 stamp log
	command -v java >/dev/null || apt_install openjdk-17-jre-headless
	command -v mvn >/dev/null || apt_install maven
	stamp=$libs/.pom-$(sha256sum "$pom" | cut -c1-16)
	[[ -f $stamp ]] && return 0
	log=$LOG/${label,,}-maven.log
	say "resolving $label jars from Maven Central into $libs"
	rm -rf "$libs" && mkdir -p "$libs"
	mvn -q -B -f "$pom" dependency:copy-dependencies \
		-DoutputDirectory="$libs" >"$log" 2>&1 ||
		die "Maven could not resolve $label; read $log"
	touch "$stamp"
}

install_kafka() { install_jars Kafka "$ROOT/deploy/kafka/pom.xml" "$(kafka_libs)"; }

install_tools() {
	case $1 in
	kafka) install_kafka ;;
	clickhouse | clickhouse-cluster) apt_install clickhouse-server clickhouse-client ;;
	redis | redis-cluster | redis-ha) apt_install redis-server ;;
	redis-sentinel) apt_install redis-server ;;
	kafka-cluster) install_kafka ;;
	zookeeper) install_zookeeper ;;
	alertmanager) apt_install prometheus-alertmanager ;;
	nginx) install_nginx ;;
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
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
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
		# The SCRAM user is written into the first metadata records. A data
		# dir formatted before the SASL listener existed is kept as it is:
		# itest.KafkaSCRAM upserts the same user over the plaintext
		# listener, so no reformat (and no data loss) is ever needed.
		java "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool format --standalone -t "$id" -c "$props" \
			--add-scram "SCRAM-SHA-512=[name=$KAFKA_SCRAM_USER,password=$(secret kafka-scram-password)]" \
			>>"$LOG/kafka.out" 2>&1 || die "formatting Kafka storage failed; read $LOG/kafka.out"
	fi
	: >"$LOG/kafka.log" # readiness greps this log: start it empty
	setsid nohup java "${jopts[@]}" -cp "$cp" kafka.Kafka "$props" >>"$LOG/kafka.out" 2>&1 </dev/null &
	echo $! >"$RUN/kafka.pid"
	wait_ready kafka "$LOG/kafka.log" kafka_ready
}

kafka_ready() {
	port_open "$KAFKA_PORT" && port_open "$KAFKA_SASL_PORT" && grep -q "Kafka Server started" "$LOG/kafka.log"
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
	ensure_certs
	local t=$SECRETS/tls
	redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
		--tls-port "$REDIS_TLS_PORT" --tls-cert-file "$t/server.pem" --tls-key-file "$t/server-key.pem" \
		--tls-ca-cert-file "$t/ca.pem" --tls-auth-clients no \
		--pidfile "$RUN/redis.pid" --logfile "$LOG/redis.log" --dir "$d" \
		--save "" --appendonly no --protected-mode yes ||
		die "redis-server failed to start; read $LOG/redis.log"
	local i
	for i in $(seq 50); do [[ -s $RUN/redis.pid ]] && break; sleep 0.1; done
	wait_ready redis "$LOG/redis.log" redis-cli -p "$REDIS_PORT" ping
	redis_secure
}

# redis_secure makes a running Redis serve TLS on $REDIS_TLS_PORT and know
# the ACL user, without a restart: a Redis started by an older version of
# this script gets both through CONFIG SET, and the user's password is
# (re)set from $SECRETS every time. The default user stays passwordless for
# the plaintext port every other test uses.
redis_secure() {
	ensure_certs
	local t=$SECRETS/tls cli=(redis-cli -p "$REDIS_PORT")
	# Setting the files again makes Redis reload them, so certificates
	# regenerated after a deleted secrets folder are served at once.
	"${cli[@]}" CONFIG SET tls-cert-file "$t/server.pem" tls-key-file "$t/server-key.pem" \
		tls-ca-cert-file "$t/ca.pem" tls-auth-clients no | grep -q OK ||
		die "redis refused the TLS certificate settings (is redis-server built with TLS?); read $LOG/redis.log"
	if ! port_open "$REDIS_TLS_PORT"; then
		say "redis: enabling TLS on 127.0.0.1:$REDIS_TLS_PORT"
		"${cli[@]}" CONFIG SET tls-port "$REDIS_TLS_PORT" | grep -q OK ||
			die "redis could not listen with TLS on $REDIS_TLS_PORT; read $LOG/redis.log"
	fi
	"${cli[@]}" ACL SETUSER "$REDIS_ACL_USER" reset on ">$(secret redis-password)" '~*' '&*' +@all | grep -q OK ||
		die "redis could not create the ACL user $REDIS_ACL_USER; read $LOG/redis.log"
}

# The Redis Cluster: three cluster-enabled redis-server processes, each with
# its own folder (nodes.conf, the node's identity and slot map) under
# $DIR/redis-cluster/<port>, pid file redis-cluster-<port>.pid and log
# redis-cluster-<port>.log. Like the single Redis it keeps no data across a
# restart (the enforcer rewrites its flags); nodes.conf survives, so a
# restarted node rejoins the cluster it belonged to.
start_cluster_node() { start_redis_node redis-cluster "$1" 5000; }

# start_redis_node NAME PORT NODE_TIMEOUT_MS [ARG...] starts one
# cluster-enabled redis-server of the cluster NAME, without persistence:
# folder $DIR/NAME/PORT, pid file NAME-PORT.pid, log NAME-PORT.log; the
# ARGs are more redis-server options.
start_redis_node() {
	local name=$1 p=$2 timeout=$3
	shift 3
	local d=$DIR/$name/$p
	mkdir -p "$d"
	# A stale pid file would pass for the new daemon before it writes its own.
	rm -f "$RUN/$name-$p.pid"
	redis-server --bind 127.0.0.1 --port "$p" --daemonize yes \
		--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "$timeout" "$@" \
		--pidfile "$RUN/$name-$p.pid" --logfile "$LOG/$name-$p.log" --dir "$d" \
		--save "" --appendonly no --protected-mode yes ||
		die "$name node $p failed to start; read $LOG/$name-$p.log"
	local i
	for i in $(seq 50); do [[ -s $RUN/$name-$p.pid ]] && break; sleep 0.1; done
	wait_ready "$name-$p" "$LOG/$name-$p.log" redis-cli -p "$p" ping
}

# cluster_info PORT FIELD prints one field of CLUSTER INFO of a node.
cluster_info() {
	redis-cli -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"
}

cluster_ok() {
	local p
	for p in "${REDIS_CLUSTER_PORTS[@]}"; do
		[[ $(cluster_info "$p" cluster_state) == ok && $(cluster_info "$p" cluster_known_nodes) == 3 ]] || return 1
	done
}

up_redis_cluster() { up_redis_nodes redis-cluster start_cluster_node cluster_ok 0 "${REDIS_CLUSTER_PORTS[@]}"; }

# up_redis_nodes NAME START OK REPLICAS PORT... starts the nodes of the
# Redis Cluster NAME that are not running (START PORT starts one), creates
# the cluster once (all its nodes empty and alone) with REPLICAS replicas
# per master, and waits until OK says every node sees it healthy. It is
# idempotent: running nodes are reused and a formed cluster is never
# created again.
up_redis_nodes() {
	local name=$1 start=$2 ok=$3 replicas=$4
	shift 4
	local ports=("$@") p started=0
	for p in "${ports[@]}"; do
		multi_alive "$name" "$p" && continue
		free_or_die "$name" "$p" "$((p + 10000))"
		((started)) || install_tools "$name"
		say "starting $name node on 127.0.0.1:$p"
		"$start" "$p"
		started=1
	done
	if "$ok"; then
		((started)) && say "$name ready" || say "$name already running on 127.0.0.1:${ports[0]}-${ports[-1]} (reused)"
		return 0
	fi
	local fresh=1
	for p in "${ports[@]}"; do
		[[ $(cluster_info "$p" cluster_known_nodes) == 1 && $(cluster_info "$p" cluster_slots_assigned) == 0 ]] || fresh=0
	done
	if ((fresh)); then
		local masters=$((${#ports[@]} / (replicas + 1))) each="no replicas"
		((replicas == 0)) || each="$replicas replica each"
		say "$name: creating the cluster ($masters masters, $each)"
		local nodes=()
		for p in "${ports[@]}"; do nodes+=("127.0.0.1:$p"); done
		redis-cli --cluster create "${nodes[@]}" --cluster-replicas "$replicas" --cluster-yes \
			>>"$LOG/$name-create.log" 2>&1 ||
			die "redis-cli --cluster create failed; read $LOG/$name-create.log"
	fi
	# Restarted nodes, or a just-created cluster, agree within a few
	# seconds of gossip.
	local deadline=$((SECONDS + READY_TIMEOUT))
	until "$ok"; do
		((SECONDS < deadline)) || die "$name: the nodes on ${ports[*]} do not form one healthy cluster (redis-cli -p ${ports[0]} cluster nodes); \`$0 down\` and remove $DIR/$name to make a new one"
		sleep 0.5
	done
	say "$name ready"
}

stop_redis_cluster() {
	local p
	for p in "${REDIS_CLUSTER_PORTS[@]}"; do stop_one "redis-cluster-$p"; done
}

# ---------------------------------------------------------------------------
# The engine clusters (docs/scaling.md). Each process has a pid file
# <service>-<port>.pid and a log <service>-<port>.log; `up` starts the
# processes that are not running and reuses the rest, so after a test's
# kill -9 of one node, `up <service>` brings just that node back.

multi_alive() { pid_alive "$1-$2" && port_open "$2"; }

# start_daemon NAME CMD...: runs CMD detached with its output in the log of
# NAME and its pid in NAME.pid.
start_daemon() {
	local name=$1
	shift
	setsid nohup "$@" >>"$LOG/$name.out" 2>&1 </dev/null &
	echo $! >"$RUN/$name.pid"
}

# free_or_die SERVICE PORT...: each port must be free (a node of ours that
# is down leaves its port free).
free_or_die() {
	local s=$1 p
	shift
	for p in "$@"; do
		port_open "$p" && die "port $p for $s is taken by a process this script did not start; stop it or move $s's ports (README: services)"
	done
	return 0
}

zookeeper_libs() { echo "$CACHE/zookeeper-libs"; }

install_zookeeper() { install_jars ZooKeeper "$ROOT/deploy/zookeeper/pom.xml" "$(zookeeper_libs)"; }

# ZooKeeper: one standalone server for the ClickHouse replicas' metadata
# (replication log, deduplication block ids, distributed DDL queue). Its
# admin HTTP server is off (it would take port 8080).
start_zookeeper() {
	local d=$DIR/zookeeper
	mkdir -p "$d/data"
	cat >"$d/zoo.cfg" <<ZOO
tickTime=1000
initLimit=10
syncLimit=5
dataDir=$d/data
clientPort=$ZOOKEEPER_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=200
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
ZOO
	start_daemon zookeeper java -Xms64m -Xmx256m -XX:+UseSerialGC -Djava.awt.headless=true \
		-Dzookeeper.admin.enableServer=false \
		-Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dorg.slf4j.simpleLogger.logFile="$LOG/zookeeper.log" \
		-cp "$(zookeeper_libs)/*" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
	wait_ready zookeeper "$LOG/zookeeper.out" zookeeper_ready
}

zookeeper_ready() {
	port_open "$ZOOKEEPER_PORT" || return 1
	exec 3<>"/dev/tcp/127.0.0.1/$ZOOKEEPER_PORT"
	# ruok answers imok even while the server cannot serve; srvr does not.
	printf 'srvr' >&3
	local answer
	answer=$(timeout 2 cat <&3 || true)
	exec 3>&-
	[[ $answer == *"Mode: standalone"* ]]
}

# The ClickHouse cluster: two 18.16 servers, each with its own folder
# $DIR/clickhouse-cluster/<port> (config, data, logs), replicas of the
# clusters in deploy/clickhouse/cluster.xml. Data is kept across restarts:
# a replica killed and started again catches up from the other through
# ZooKeeper and the interserver port.
start_ch_node() {
	local i=$1 p=${CLICKHOUSE_CLUSTER_PORTS[$1]}
	local d=$DIR/clickhouse-cluster/$p
	mkdir -p "$d"/{data,tmp,user_files,format_schemas,log,conf/config.d}
	sed -e "s#@DATA@#$d#g" -e "s#@CONF@#$d/conf#g" \
		-e "s#@TCP_PORT@#$p#g" -e "s#@HTTP_PORT@#$((p - 1000))#g" \
		"$ROOT/deploy/clickhouse/config.xml" >"$d/conf/config.xml"
	# The sharded layout's reads by tenant need distributed_product_mode
	# local in the user's profile (docs/scaling.md).
	sed -e 's#<load_balancing>random</load_balancing>#&<distributed_product_mode>local</distributed_product_mode>#' \
		"$ROOT/deploy/clickhouse/users.xml" >"$d/conf/users.xml"
	sed -e "s#@INTERSERVER_PORT@#$((p + 10))#g" -e "s#@ZK_PORT@#$ZOOKEEPER_PORT#g" \
		-e "s#@REPLICA@#ch$((i + 1))#g" -e "s#@SHARDED_SHARD@#0$((i + 1))#g" \
		-e "s#@CH1_PORT@#${CLICKHOUSE_CLUSTER_PORTS[0]}#g" -e "s#@CH2_PORT@#${CLICKHOUSE_CLUSTER_PORTS[1]}#g" \
		"$ROOT/deploy/clickhouse/cluster.xml" >"$d/conf/config.d/cluster.xml"
	ln -sf "$d/log/clickhouse-server.err.log" "$LOG/clickhouse-cluster-$p.log"
	(cd "$d" && exec setsid nohup clickhouse-server --config-file="$d/conf/config.xml" \
		>>"$LOG/clickhouse-cluster-$p.out" 2>&1 </dev/null) &
	echo $! >"$RUN/clickhouse-cluster-$p.pid"
}

ch_node_ready() { clickhouse-client --host 127.0.0.1 --port "$1" --query "SELECT count() FROM system.zookeeper WHERE path = '/'"; }

up_clickhouse_cluster() { up_nodes clickhouse-cluster start_ch_node ch_node_ready "-1000 10" "${CLICKHOUSE_CLUSTER_PORTS[@]}"; }

# up_nodes NAME START READY OFFSETS PORT... starts each node of the cluster
# NAME that does not run — START I starts node I, whose port is the I-th
# PORT and which needs PORT plus each of OFFSETS free — and then waits until
# READY PORT says each started node serves. The nodes all start before any
# is waited for: Kafka's brokers wait for a controller quorum of two.
up_nodes() {
	local name=$1 start=$2 ready=$3 offsets=$4
	shift 4
	local ports=("$@") i p o free started=()
	for i in "${!ports[@]}"; do
		p=${ports[$i]}
		multi_alive "$name" "$p" && continue
		free=("$p")
		for o in $offsets; do free+=("$((p + o))"); done
		free_or_die "$name" "${free[@]}"
		((${#started[@]})) || install_tools "$name"
		say "starting $name node $((i + 1)) on 127.0.0.1:$p"
		"$start" "$i"
		started+=("$p")
	done
	for p in "${started[@]}"; do
		wait_ready "$name-$p" "$LOG/$name-$p.out" "$ready" "$p"
	done
	((${#started[@]})) || say "$name already running on 127.0.0.1:${ports[0]}-${ports[-1]} (reused)"
}

# The Kafka cluster: three combined broker+controller nodes (node ids 1-3)
# with a static controller quorum, each with its own folder
# $DIR/kafka-cluster/<port>. Topics default to replication factor 3 and
# min.insync.replicas 2, the internal topics too. Data is kept across
# restarts: a broker killed and started again catches up from the others.
start_kafka_node() {
	local i=$1 p=${KAFKA_CLUSTER_PORTS[$1]}
	local d=$DIR/kafka-cluster/$p props voters="" j
	props=$d/server.properties
	mkdir -p "$d/data" "$LOG/kafka-cluster-$p"
	for j in "${!KAFKA_CLUSTER_PORTS[@]}"; do
		voters+="${voters:+,}$((j + 1))@127.0.0.1:$((KAFKA_CLUSTER_PORTS[j] + 10))"
	done
	cat >"$props" <<PROPS
process.roles=broker,controller
node.id=$((i + 1))
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$p,CONTROLLER://127.0.0.1:$((p + 10))
advertised.listeners=PLAINTEXT://127.0.0.1:$p
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$d/data
num.partitions=4
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=24
num.network.threads=2
num.io.threads=2
background.threads=2
PROPS
	local cp="$(kafka_libs)/*"
	local jopts=(-Xms128m -Xmx384m -XX:+UseG1GC -Djava.awt.headless=true
		-Dkafka.logs.dir="$LOG/kafka-cluster-$p" -Dlog4j2.configurationFile="$ROOT/deploy/kafka/log4j2.properties")
	if [[ ! -f $d/data/meta.properties ]]; then
		java "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$(kafka_cluster_id)" -c "$props" \
			>>"$LOG/kafka-cluster-$p.out" 2>&1 || die "formatting Kafka storage of $p failed; read $LOG/kafka-cluster-$p.out"
	fi
	: >"$LOG/kafka-cluster-$p/kafka.log"
	ln -sf "$LOG/kafka-cluster-$p/kafka.log" "$LOG/kafka-cluster-$p.log"
	start_daemon "kafka-cluster-$p" java "${jopts[@]}" -cp "$cp" kafka.Kafka "$props"
}

# kafka_cluster_id: the cluster's id, made once and kept beside the nodes.
kafka_cluster_id() {
	local f=$DIR/kafka-cluster/cluster-id
	if [[ ! -s $f ]]; then
		mkdir -p "$DIR/kafka-cluster"
		java -cp "$(kafka_libs)/*" kafka.tools.StorageTool random-uuid 2>>"$LOG/kafka-cluster.out" >"$f" ||
			die "kafka-cluster: no cluster id; read $LOG/kafka-cluster.out"
	fi
	cat "$f"
}

kafka_node_ready() { port_open "$1" && grep -q "Kafka Server started" "$LOG/kafka-cluster-$1/kafka.log"; }

up_kafka_cluster() { up_nodes kafka-cluster start_kafka_node kafka_node_ready 10 "${KAFKA_CLUSTER_PORTS[@]}"; }

# The Redis Cluster with replicas: six cluster-enabled redis-server
# processes, three masters and a replica of each, created once with
# redis-cli --cluster create --cluster-replicas 1. No persistence, as for
# the other Redis: a node killed and started again rejoins (nodes.conf
# stays) empty, as a replica of whichever node took its slots over.
# cluster-node-timeout is 2 s, so a dead master's replica is promoted
# within about 2-4 s.
start_ha_node() { start_redis_node redis-ha "$1" 2000 --cluster-replica-validity-factor 0; }

# redis_ha_ok: every node sees a healthy cluster of six with three masters.
redis_ha_ok() {
	local p masters
	for p in "${REDIS_HA_PORTS[@]}"; do
		[[ $(cluster_info "$p" cluster_state) == ok && $(cluster_info "$p" cluster_known_nodes) == 6 ]] || return 1
	done
	masters=$(redis-cli -p "${REDIS_HA_PORTS[0]}" cluster nodes 2>/dev/null | grep -v fail | grep -c master)
	[[ $masters == 3 ]]
}

up_redis_ha() { up_redis_nodes redis-ha start_ha_node redis_ha_ok 1 "${REDIS_HA_PORTS[@]}"; }

# Redis with Sentinel: a primary and a replica (no persistence) and three
# Sentinels (quorum 2, down-after 2 s, failover timeout 10 s) under the
# master name "sluice". Sentinels rewrite their own configuration files
# (kept under $DIR/redis-sentinel), so after a failover they keep
# following the new primary; a data node restarted by `up` starts as a
# replica of the primary the Sentinels name, or, when none answers (first
# start), of the first data port.
start_sentinel_data() {
	local p=$1 d=$DIR/redis-sentinel/$1 primary=$2
	mkdir -p "$d"
	rm -f "$RUN/redis-sentinel-$p.pid"
	local args=(--bind 127.0.0.1 --port "$p" --daemonize yes
		--pidfile "$RUN/redis-sentinel-$p.pid" --logfile "$LOG/redis-sentinel-$p.log" --dir "$d"
		--save "" --appendonly no --protected-mode yes)
	[[ $primary != "127.0.0.1:$p" ]] && args+=(--replicaof 127.0.0.1 "${primary##*:}")
	redis-server "${args[@]}" || die "redis-sentinel data node $p failed to start; read $LOG/redis-sentinel-$p.log"
	local i
	for i in $(seq 50); do [[ -s $RUN/redis-sentinel-$p.pid ]] && break; sleep 0.1; done
	wait_ready "redis-sentinel-$p" "$LOG/redis-sentinel-$p.log" redis-cli -p "$p" ping
}

start_sentinel() {
	local p=$1 d=$DIR/redis-sentinel/$1
	mkdir -p "$d"
	rm -f "$RUN/redis-sentinel-$p.pid"
	if [[ ! -s $d/sentinel.conf ]]; then
		cat >"$d/sentinel.conf" <<SENT
bind 127.0.0.1
port $p
protected-mode no
dir $d
sentinel monitor $REDIS_SENTINEL_MASTER 127.0.0.1 ${REDIS_SENTINEL_DATA_PORTS[0]} 2
sentinel down-after-milliseconds $REDIS_SENTINEL_MASTER 2000
sentinel failover-timeout $REDIS_SENTINEL_MASTER 10000
sentinel parallel-syncs $REDIS_SENTINEL_MASTER 1
SENT
	fi
	redis-server "$d/sentinel.conf" --sentinel --daemonize yes \
		--pidfile "$RUN/redis-sentinel-$p.pid" --logfile "$LOG/redis-sentinel-$p.log" ||
		die "sentinel $p failed to start; read $LOG/redis-sentinel-$p.log"
	local i
	for i in $(seq 50); do [[ -s $RUN/redis-sentinel-$p.pid ]] && break; sleep 0.1; done
	wait_ready "redis-sentinel-$p" "$LOG/redis-sentinel-$p.log" redis-cli -p "$p" ping
}

# sentinel_primary prints the primary host:port a running Sentinel names.
sentinel_primary() {
	local p out
	for p in "${REDIS_SENTINEL_PORTS[@]}"; do
		out=$(redis-cli -p "$p" sentinel get-master-addr-by-name "$REDIS_SENTINEL_MASTER" 2>/dev/null | tr -d '\r' | paste -sd: -)
		[[ -n $out && $out != *:*:* ]] && { echo "$out"; return 0; }
	done
	return 1
}

redis_sentinel_ok() {
	local primary role p n
	primary=$(sentinel_primary) || return 1
	role=$(redis-cli -p "${primary##*:}" role 2>/dev/null | head -1 | tr -d '\r')
	[[ $role == master ]] || return 1
	n=$(redis-cli -p "${primary##*:}" info replication 2>/dev/null | tr -d '\r' | sed -n 's/^connected_slaves://p')
	[[ $n == 1 ]] || return 1
	for p in "${REDIS_SENTINEL_PORTS[@]}"; do
		n=$(redis-cli -p "$p" sentinel master "$REDIS_SENTINEL_MASTER" 2>/dev/null | tr -d '\r' | sed -n '/^num-other-sentinels$/{n;p}')
		[[ $n == 2 ]] || return 1
	done
}

up_redis_sentinel() {
	local p started=0 primary
	install_tools redis-sentinel
	primary=$(sentinel_primary) || primary=127.0.0.1:${REDIS_SENTINEL_DATA_PORTS[0]}
	for p in "${REDIS_SENTINEL_DATA_PORTS[@]}"; do
		pid_alive "redis-sentinel-$p" && port_open "$p" && continue
		free_or_die redis-sentinel "$p"
		say "starting redis-sentinel data node on 127.0.0.1:$p"
		start_sentinel_data "$p" "$primary"
		started=1
	done
	for p in "${REDIS_SENTINEL_PORTS[@]}"; do
		pid_alive "redis-sentinel-$p" && port_open "$p" && continue
		free_or_die redis-sentinel "$p"
		say "starting sentinel on 127.0.0.1:$p"
		start_sentinel "$p"
		started=1
	done
	local deadline=$((SECONDS + READY_TIMEOUT))
	until redis_sentinel_ok; do
		((SECONDS < deadline)) || die "redis-sentinel: no healthy primary with a replica under three Sentinels (redis-cli -p ${REDIS_SENTINEL_PORTS[0]} sentinel master $REDIS_SENTINEL_MASTER); \`$0 down\` and remove $DIR/redis-sentinel to start again"
		sleep 0.5
	done
	((started)) && say "redis-sentinel ready (primary $(sentinel_primary))" ||
		say "redis-sentinel already running (primary $(sentinel_primary), Sentinels on 127.0.0.1:${REDIS_SENTINEL_PORTS[0]}-${REDIS_SENTINEL_PORTS[2]}) (reused)"
}

# multi_ports SERVICE prints the ports of a multi-process service.
multi_ports() {
	case $1 in
	clickhouse-cluster) echo "${CLICKHOUSE_CLUSTER_PORTS[*]}" ;;
	kafka-cluster) echo "${KAFKA_CLUSTER_PORTS[*]}" ;;
	redis-ha) echo "${REDIS_HA_PORTS[*]}" ;;
	redis-sentinel) echo "${REDIS_SENTINEL_DATA_PORTS[*]} ${REDIS_SENTINEL_PORTS[*]}" ;;
	esac
}

stop_multi() {
	local p
	for p in $(multi_ports "$1"); do stop_one "$1-$p"; done
}

multi_ok() {
	local s=$1 p
	case $s in
	redis-ha) redis_ha_ok ;;
	redis-sentinel) redis_sentinel_ok ;;
	*) for p in $(multi_ports "$s"); do multi_alive "$s" "$p" || return 1; done ;;
	esac
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
	redis-cluster) echo "$REDIS_CLUSTER_PORT" ;;
	alertmanager) echo "$ALERTMANAGER_PORT" ;;
	zookeeper) echo "$ZOOKEEPER_PORT" ;;
	clickhouse-cluster) echo "$CLICKHOUSE_CLUSTER_PORT" ;;
	kafka-cluster) echo "$KAFKA_CLUSTER_PORT" ;;
	redis-ha) echo "$REDIS_HA_PORT" ;;
	redis-sentinel) echo "$REDIS_SENTINEL_PORT" ;;
	*) die "unknown service '$1' (known: ${ALL_SERVICES[*]})" ;;
	esac
}

up_one() {
	local s=$1 port
	port=$(service_port "$s")
	case $s in
	redis-cluster) up_redis_cluster; return 0 ;;
	clickhouse-cluster)
		# The replicas need ZooKeeper.
		up_one zookeeper
		up_clickhouse_cluster
		return 0
		;;
	kafka-cluster) up_kafka_cluster; return 0 ;;
	redis-ha) up_redis_ha; return 0 ;;
	redis-sentinel) up_redis_sentinel; return 0 ;;
	esac
	if pid_alive "$s" && port_open "$port"; then
		case $s in
		kafka)
			# Listeners are static broker settings: a broker started by an
			# older version of this script lacks the SASL one and is
			# restarted once (its data is kept).
			if ! port_open "$KAFKA_SASL_PORT"; then
				say "kafka runs without the SASL listener on $KAFKA_SASL_PORT; restarting it once (data kept)"
				stop_one kafka
				install_tools kafka
				start_kafka
				return 0
			fi
			;;
		redis) redis_secure ;;
		esac
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
# partitioner other than the Go clients', see docs/producers.md); promtool,
# from Debian's prometheus package, which deploy/deploy_test.go runs on the
# Prometheus rules (check rules, test rules); and nginx, for the
# forward-auth test (services/authz). nginx is no shared service here: each
# test starts its own, non-daemon, with a configuration that points
# auth_request at the endpoint and proxy_pass at the mock upstream it
# started, under its own temporary folder (pid, logs, temp files), on a
# free loopback port; `env` names the binary (SLUICE_NGINX_BIN). Debian's
# package does not start a system nginx where services are not started by
# apt (policy-rc.d, containers); on a machine with systemd it does, on port
# 80, as for the other packages here. And Debian's chromium, the headless
# browser the console's browser test (cmd/sluice/console_test.go) drives
# through chromedp.
install_test_tools() {
	command -v kcat >/dev/null || apt_install kcat
	command -v promtool >/dev/null || apt_install prometheus
	command -v chromium >/dev/null || apt_install chromium
	install_nginx
}

install_nginx() { [[ -x $NGINX_BIN ]] || apt_install nginx; }

# nginx_status prints the nginx line of `status`: whether the tests find
# the binary.
nginx_status() {
	if [[ -x $NGINX_BIN ]]; then
		printf '%-13s ready %s (started per test)\n' nginx "$NGINX_BIN"
	else
		printf '%-13s missing (scripts/services.sh install nginx)\n' nginx
		return 1
	fi
}

cmd_up() {
	mkdir -p "$LOG" "$RUN" "$CACHE"
	# The files `env` names exist whatever was started.
	secret kafka-scram-password >/dev/null
	secret redis-password >/dev/null
	local s
	for s in "${@:-${ALL_SERVICES[@]}}"; do up_one "$s"; done
	install_test_tools
	cmd_env
}

cmd_down() {
	local s
	# Reverse order: the ClickHouse replicas before their ZooKeeper.
	local i
	for ((i = ${#ALL_SERVICES[@]} - 1; i >= 0; i--)); do
		s=${ALL_SERVICES[$i]}
		case $s in
		redis-cluster) stop_redis_cluster ;;
		clickhouse-cluster | kafka-cluster | redis-ha | redis-sentinel) stop_multi "$s" ;;
		*) stop_one "$s" ;;
		esac
	done
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
		if [[ $s == redis-cluster ]]; then
			if cluster_ok 2>/dev/null; then
				printf '%-13s up    127.0.0.1:%s-%s (3 masters)\n' "$s" "${REDIS_CLUSTER_PORTS[0]}" "${REDIS_CLUSTER_PORTS[2]}"
			else
				printf '%-13s down\n' "$s"
				rc=1
			fi
			continue
		fi
		case $s in
		clickhouse-cluster | kafka-cluster | redis-ha | redis-sentinel)
			if multi_ok "$s" 2>/dev/null; then
				printf '%-13s up    127.0.0.1:%s\n' "$s" "$(multi_ports "$s" | tr ' ' ',')"
			else
				printf '%-13s down\n' "$s"
				rc=1
			fi
			continue
			;;
		esac
		if pid_alive "$s" && port_open "$port"; then
			printf '%-13s up    127.0.0.1:%s (pid %s)\n' "$s" "$port" "$(cat "$RUN/$s.pid")"
		else
			printf '%-13s down\n' "$s"
			rc=1
		fi
	done
	nginx_status || rc=1
	return $rc
}

cmd_logs() {
	local s=${1:-}
	if [[ -z $s ]]; then
		ls -1 "$LOG"
		return
	fi
	service_port "$s" >/dev/null
	if [[ $s == redis-cluster ]]; then
		local p
		for p in "${REDIS_CLUSTER_PORTS[@]}"; do
			printf '==> %s <==\n' "$LOG/redis-cluster-$p.log"
			tail -n 40 "$LOG/redis-cluster-$p.log"
		done
		return
	fi
	case $s in
	clickhouse-cluster | kafka-cluster | redis-ha | redis-sentinel)
		local p
		for p in $(multi_ports "$s"); do
			printf '==> %s <==\n' "$LOG/$s-$p.log"
			tail -n 40 "$LOG/$s-$p.log"
		done
		return
		;;
	esac
	tail -n 100 "$LOG/$s.log"
}

# join_addrs PORT... prints 127.0.0.1:PORT,127.0.0.1:PORT...
join_addrs() {
	local out="" p
	for p in "$@"; do out+="${out:+,}127.0.0.1:$p"; done
	echo "$out"
}

# env prints the addresses in the SLUICE_* variables the services and tests read.
cmd_env() {
	cat <<EOF
SLUICE_KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT
SLUICE_CLICKHOUSE_ADDR=127.0.0.1:$CLICKHOUSE_PORT
SLUICE_REDIS_ADDR=127.0.0.1:$REDIS_PORT
SLUICE_REDIS_CLUSTER_ADDRS=127.0.0.1:${REDIS_CLUSTER_PORTS[0]},127.0.0.1:${REDIS_CLUSTER_PORTS[1]},127.0.0.1:${REDIS_CLUSTER_PORTS[2]}
SLUICE_ALERTMANAGER_URL=http://127.0.0.1:$ALERTMANAGER_PORT
SLUICE_ITEST_KAFKA_SCRAM_BROKERS=127.0.0.1:$KAFKA_SASL_PORT
SLUICE_ITEST_KAFKA_SCRAM_USER=$KAFKA_SCRAM_USER
SLUICE_ITEST_KAFKA_SCRAM_PASSWORD_FILE=$SECRETS/kafka-scram-password
SLUICE_ITEST_REDIS_TLS_ADDR=127.0.0.1:$REDIS_TLS_PORT
SLUICE_ITEST_REDIS_TLS_CA_FILE=$SECRETS/tls/ca.pem
SLUICE_ITEST_REDIS_USER=$REDIS_ACL_USER
SLUICE_ITEST_REDIS_PASSWORD_FILE=$SECRETS/redis-password
SLUICE_NGINX_BIN=$NGINX_BIN
SLUICE_ZOOKEEPER_ADDR=127.0.0.1:$ZOOKEEPER_PORT
SLUICE_CLICKHOUSE_CLUSTER_ADDRS=127.0.0.1:${CLICKHOUSE_CLUSTER_PORTS[0]},127.0.0.1:${CLICKHOUSE_CLUSTER_PORTS[1]}
SLUICE_KAFKA_CLUSTER_BROKERS=127.0.0.1:${KAFKA_CLUSTER_PORTS[0]},127.0.0.1:${KAFKA_CLUSTER_PORTS[1]},127.0.0.1:${KAFKA_CLUSTER_PORTS[2]}
SLUICE_REDIS_HA_ADDRS=$(join_addrs "${REDIS_HA_PORTS[@]}")
SLUICE_ITEST_REDIS_SENTINEL_ADDRS=$(join_addrs "${REDIS_SENTINEL_PORTS[@]}")
SLUICE_ITEST_REDIS_SENTINEL_MASTER=$REDIS_SENTINEL_MASTER
SLUICE_SERVICES_DIR=$DIR
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
reset) cmd_down; rm -rf "$DIR"/{kafka,clickhouse,redis,redis-cluster,alertmanager,zookeeper,clickhouse-cluster,kafka-cluster,redis-ha,redis-sentinel,log,run} ;;
*)
	sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
	;;
esac
