#!/usr/bin/env bash
# A real one-node Slurm on localhost, for the tests that submit through sbatch (tests/pipeline/test_slurm_real.py)
# and for trying profiles/slurm by hand:
#
#   sudo scripts/slurm_local.sh start     # install (apt, first time only), configure, start; prints timings
#   sudo scripts/slurm_local.sh status    # which daemons run; sinfo; exit 1 if one is down
#   sudo scripts/slurm_local.sh stop      # stop every daemon by the pid this script recorded
#
# Debian's slurm-wlm 22.05 on a root shell without systemd (a CI container): munged, mariadbd,
# slurmdbd, slurmctld and slurmd run in the foreground of their own session, in the background of
# this script, each with a pid file under $RUN. Facts behind each setting: ../shared/reference
# SLURM-LOCAL.md. Accounting (slurmdbd + MariaDB) is there because the executor plugin polls job
# states with `sacct`, which answers only "accounting storage is disabled" without a database, and
# because `sacct` is where the tests read each job's requested memory, time and CPUs.
set -euo pipefail

RUN=/run/esgrpo-slurm            # pid files
LOG=/var/log/esgrpo-slurm        # daemon logs
CONF=/etc/slurm
CLUSTER=esgrpo
ACCOUNT=esgrpo                   # the account the tests and the local profile submit under
DB_PASS=esgrpo-local             # MariaDB on 127.0.0.1 only; the password never leaves this host
DAEMONS=(munged mariadbd slurmdbd slurmctld slurmd)
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

T0=$(date +%s.%N)
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "[slurm_local $(elapsed) s] $*"; }
die() { echo "slurm_local: $*" >&2; exit 1; }

pid_of() { cat "$RUN/$1.pid" 2>/dev/null || true; }
running() { local pid; pid=$(pid_of "$1"); [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s until it succeeds
    local limit=$1 what=$2; shift 2
    local deadline=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        (( $(date +%s) < deadline )) || die "$what not ready after ${limit} s (logs: $LOG)"
        sleep 0.2
    done
}

# --------------------------------------------------------------------------- install

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if (( ${#missing[@]} == 0 )); then
        say "packages installed already"
        return
    fi
    command -v apt-get >/dev/null || die "no apt-get: install ${missing[*]} by hand (Debian/Ubuntu packages)"
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    # policy-rc.d = 101: the packages' postinst must not start daemons (no init system; this script starts them).
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' > $policy; chmod 755 $policy; made_policy=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$LOG/apt.log" 2>&1 \
        || { (( made_policy )) && rm -f $policy; tail -20 "$LOG/apt.log"; die "apt-get install failed"; }
    (( made_policy )) && rm -f $policy
    say "packages installed"
}

# --------------------------------------------------------------------------- configuration

write_if_changed() {  # write_if_changed PATH MODE: stdin -> PATH when it differs; exit 0 if it changed
    local path=$1 mode=$2 tmp
    tmp=$(mktemp "$path.XXXX")
    cat > "$tmp"
    chmod "$mode" "$tmp"
    if [[ -f $path ]] && cmp -s "$tmp" "$path"; then rm -f "$tmp"; return 1; fi
    mv "$tmp" "$path"
}

configure() {  # exit 0 when slurm.conf or slurmdbd.conf changed
    local host node changed=1
    host=$(hostname -s)
    # slurmctld and slurmd look themselves up by the short host name.
    getent hosts "$host" >/dev/null || { echo "127.0.0.1 $host" >> /etc/hosts; say "added $host to /etc/hosts"; }
    # The node as slurmd sees it (CPUs, sockets, cores, RealMemory); UpTime is not a node setting.
    node=$(slurmd -C | grep '^NodeName=')
    mkdir -p "$CONF" /var/spool/slurmctld /var/spool/slurmd /run/munge /run/mysqld /var/log/munge
    chown munge:munge /run/munge /var/log/munge
    chown mysql:mysql /run/mysqld
    write_if_changed "$CONF/slurm.conf" 644 <<EOF && changed=0
# Written by scripts/slurm_local.sh: a one-node cluster on localhost.
ClusterName=$CLUSTER
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
# No cgroups in a container: processes tracked through /proc. Tasks are bound to the job's CPUs
# (sched_setaffinity), as task/cgroup or task/affinity do on a cluster: a job that reads its cores from
# its affinity (vLLM's CPU build binds its OpenMP threads there) must not see the whole node. Under
# task/none every one-CPU vLLM job of the rehearsal pinned its worker to core 0, two at once on one core.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
# Cores and memory are consumable: a job waits until its --mem and CPUs are free (memory enforced).
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
# scancel: SIGTERM, then SIGKILL after KillWait s (the trainer releases its writer lock on SIGTERM).
KillWait=10
# The plugin's squeue status command needs finished jobs in squeue for 3 x its first status interval.
MinJobAge=300
# sbatch without --mem (by hand) gets 1 GB per CPU, not the whole node.
DefMemPerCPU=1024
# Accounting through slurmdbd: sacct for the plugin's status polls and the tests' checks;
# the job comment (the plugin writes rule_<rule>_wildcards_<...>) kept for sacct's Comment.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
# Memory as a cgroup counts it (a page shared by a job's processes once: PSS), sampled every second, so that
# sacct's MaxRSS is the peak that scripts/plan_vs_measured.py holds the plan to (Snakemake's own benchmark
# files sample every 30 s after a job's first 15 s and miss short peaks).
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherParams=UsePss
JobAcctGatherFrequency=task=1
JobCompType=jobcomp/none
$node State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=ALL Default=NO MaxTime=INFINITE State=UP
EOF
    write_if_changed "$CONF/slurmdbd.conf" 600 <<EOF && changed=0
# Written by scripts/slurm_local.sh.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    return $changed
}

# --------------------------------------------------------------------------- daemons

launch() {  # launch NAME COMMAND...: run COMMAND in its own session, in the background; record its pid
    local name=$1; shift
    setsid "$@" </dev/null >>"$LOG/$name.out" 2>&1 &
    echo $! > "$RUN/$name.pid"
}

start_munged() {
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    launch munged setpriv --reuid=munge --regid=munge --init-groups munged --foreground --log-file="$LOG/munged.log"
    wait_for 20 munged bash -c 'munge -n | unmunge'
}

start_mariadbd() {
    launch mariadbd mariadbd --user=mysql --bind-address=127.0.0.1 --port=3306 \
        --socket=/run/mysqld/mysqld.sock --log-error="$LOG/mariadbd.log"
    wait_for 60 mariadbd mariadb-admin --socket=/run/mysqld/mysqld.sock ping
    # root reaches the server through the socket (unix_socket auth); slurmdbd through 127.0.0.1.
    mariadb --socket=/run/mysqld/mysqld.sock <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
}

start_slurmdbd() {
    launch slurmdbd slurmdbd -D
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
}

start_slurmctld() {
    launch slurmctld slurmctld -D
    wait_for 60 slurmctld bash -c 'scontrol ping | grep -q UP'
}

start_slurmd() {
    launch slurmd slurmd -D
    # idle, or mixed/allocated when jobs of an earlier start were requeued onto it
    wait_for 60 slurmd bash -c 'sinfo -h -N -o %T | grep -Eq "^(idle|mixed|allocated)"'
}

add_associations() {
    # The root user's jobs charge account $ACCOUNT (AccountingStorageEnforce=associations refuses
    # jobs without one). profiles/slurm names no account: ESGRPO_SLURM_ACCOUNT or the default applies.
    sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT" \
        || sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description=esgrpo organization=esgrpo >/dev/null
    # (root exists from the start, in account root: add the association, then make it the default)
    sacctmgr -n -P list assoc user=root account="$ACCOUNT" format=account | grep -qx "$ACCOUNT" \
        || sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null
    sacctmgr -n -P list user root format=defaultaccount | grep -qx "$ACCOUNT" \
        || sacctmgr -i modify user root set defaultaccount="$ACCOUNT" >/dev/null
}

stop_one() {
    local name=$1 pid i
    pid=$(pid_of "$name")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; say "$name ($pid) killed after 10 s"; } || say "$name ($pid) stopped"
    fi
    rm -f "$RUN/$name.pid"
}

# --------------------------------------------------------------------------- commands

cmd_start() {
    [[ $(id -u) == 0 ]] || die "run as root (it installs packages and starts system daemons)"
    mkdir -p "$RUN" "$LOG"
    install_packages
    local restart=0
    configure && restart=1
    # A changed slurm.conf or slurmdbd.conf takes effect on restart of the Slurm daemons.
    if (( restart )); then
        for name in slurmd slurmctld slurmdbd; do stop_one "$name"; done
    fi
    local started=()
    for name in "${DAEMONS[@]}"; do
        if running "$name"; then continue; fi
        "start_$name"
        started+=("$name")
    done
    add_associations
    if (( ${#started[@]} )); then say "started ${started[*]}"; else say "all daemons ran already"; fi
    sinfo
    say "ready"
}

cmd_stop() {
    for (( i=${#DAEMONS[@]}-1; i>=0; i-- )); do stop_one "${DAEMONS[i]}"; done
    say "stopped"
}

cmd_status() {
    local down=0
    for name in "${DAEMONS[@]}"; do
        if running "$name"; then echo "$name: running (pid $(pid_of "$name"))"; else echo "$name: stopped"; down=1; fi
    done
    (( down )) || sinfo
    return $down
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 {start|stop|status}" >&2; exit 2 ;;
esac
