#!/usr/bin/env bash
# Runs a command with every msync(MS_SYNC) of it and of its children slowed by a fixed delay:
# an emulated device whose flush takes that much longer, for Cassandra's commit log.
#
#   scripts/slowsync.sh DELAY -- COMMAND [ARG]...
#       DELAY like 5ms, 500us or 0 (no delay). Example:
#       KIROKU_CASSANDRA_STATE=/tmp/my.state scripts/slowsync.sh 5ms -- scripts/cassandra.sh start --commitlog batch
#
# How: a small shared library, compiled here with cc into a temporary directory, is preloaded
# (LD_PRELOAD) into COMMAND and inherited by what it starts (cassandra.sh's JVMs among them).
# It wraps libc's msync: the real call runs first, then the caller sleeps DELAY before it returns,
# as if the device had taken that much longer to acknowledge the flush. The directory is removed
# when COMMAND exits; processes COMMAND left running keep the library mapped and stay slowed
# until they end.
#
# Why msync: Cassandra's commit log (memory-mapped segments, commitlog_disk_access_mode legacy or
# mmap, 5.0's default) makes a write durable with MappedByteBuffer.force, which is msync; fsync
# and fdatasync (SSTables, directories) are left alone. In kiroku bench cassandra-commitlog's counts
# the commit log's entries and Cassandra's msyncs matched one for one when each entry had a sync of
# its own, so only the commit log's device is slowed, as with a commit log on a volume of its own. This kernel has no device-mapper
# (no dm-delay), no NBD and no null_blk, which would slow a block device instead; a block-level
# delay would also slow the page writes before the flush, which this does not.
set -euo pipefail

die() { echo "slowsync.sh: $*" >&2; exit 2; }

[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: $0 DELAY -- COMMAND [ARG]..."
delay=$1
shift 2
case "$delay" in
  0) ns=0 ;;
  *[0-9]ns) ns=${delay%ns} ;;
  *[0-9]us) ns=$(( ${delay%us} * 1000 )) ;;
  *[0-9]ms) ns=$(( ${delay%ms} * 1000000 )) ;;
  *[0-9]s) ns=$(( ${delay%s} * 1000000000 )) ;;
  *) die "DELAY $delay: want a whole number of ns, us, ms or s (e.g. 5ms)" ;;
esac
[[ "$ns" =~ ^[0-9]+$ ]] || die "DELAY $delay: want a whole number of ns, us, ms or s (e.g. 5ms)"

CC=${CC:-cc}
command -v "$CC" >/dev/null || die "a C compiler ($CC) is needed to build the msync shim: apt-get install -y gcc"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kiroku-slowsync.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/slowsync.c" <<'EOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static int (*real_msync)(void *, size_t, int);
static struct timespec delay;

__attribute__((constructor)) static void slowsync_init(void) {
	real_msync = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
	const char *s = getenv("KIROKU_SLOWSYNC_NS");
	long long ns = s ? atoll(s) : 0;
	delay.tv_sec = ns / 1000000000LL;
	delay.tv_nsec = ns % 1000000000LL;
}

int msync(void *addr, size_t len, int flags) {
	int r = real_msync(addr, len, flags);
	int saved = errno;
	if ((flags & MS_SYNC) && (delay.tv_sec || delay.tv_nsec)) {
		struct timespec left = delay;
		while (nanosleep(&left, &left) == -1 && errno == EINTR) {
		}
	}
	errno = saved;
	return r;
}
EOF
"$CC" -O2 -shared -fPIC -o "$tmp/slowsync.so" "$tmp/slowsync.c" -ldl
echo "slowsync.sh: every msync(MS_SYNC) of '$1' and its children delayed by $delay" >&2
LD_PRELOAD="$tmp/slowsync.so${LD_PRELOAD:+:$LD_PRELOAD}" KIROKU_SLOWSYNC_NS=$ns "$@"
