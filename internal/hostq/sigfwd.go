package hostq

/*
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

// Signal forwarders. Without Go, an nginx worker has one thread, so every
// signal sent to the process runs its handler on the nginx thread, and a
// signal that thread blocks waits there until it is unblocked or read from
// a signalfd. Go's threads do not block SIGCHLD (the runtime unblocks it on
// every thread it starts), nor the other asynchronous signals, so the
// kernel hands such signals to a Go thread, where the host's handler then
// runs. For SIGCHLD that breaks os.execute/io.popen (nginx's handler reaps
// the child on the Go thread, system() gets ECHILD: openresty/openresty#1022)
// and ngx.pipe (ngx_lua blocks SIGCHLD on the nginx thread and reads it
// from a signalfd, which never sees it: golang/go#55066). For SIGALRM,
// SIGQUIT... the handler sets nginx's flag without interrupting its
// epoll_wait. So, for the asynchronous signals that have a handler, we
// install one that re-sends the signal to the nginx thread when it lands
// on any other thread, and calls the host's handler otherwise.
static const int qrpc_fwd_signals[] = {
	SIGCHLD, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH, SIGIO, SIGALRM,
};
static struct sigaction qrpc_prev[NSIG];
static volatile pid_t qrpc_host_tid;

static void qrpc_run_prev(int sig, siginfo_t *si, void *uc) {
	const struct sigaction *p = &qrpc_prev[sig];
	if (p->sa_flags & SA_SIGINFO) {
		if (p->sa_sigaction != NULL) p->sa_sigaction(sig, si, uc);
	} else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
		p->sa_handler(sig);
	}
}

// Async-signal-safe: syscalls and a struct copy only.
static void qrpc_forward(int sig, siginfo_t *si, void *uc) {
	int saved = errno;
	pid_t host = qrpc_host_tid;
	if (host != 0 && (pid_t)syscall(SYS_gettid) != host) {
		// Keep the siginfo (si_pid: nginx logs it). The kernel accepts a
		// forged siginfo from another thread only with a negative si_code.
		siginfo_t info = *si;
		info.si_code = SI_QUEUE;
		if (syscall(SYS_rt_tgsigqueueinfo, getpid(), host, sig, &info) == 0 ||
		    syscall(SYS_tgkill, getpid(), host, sig) == 0) {
			errno = saved;
			return;
		}
		// The nginx thread is gone (cannot happen in nginx): handle it here.
	}
	qrpc_run_prev(sig, si, uc);
	errno = saved;
}

// Installs the forwarders once, recording the calling thread as the host's.
// Returns how many signals are forwarded (0 on later calls).
static int qrpc_install_forwarders(void);

// At dlopen, on the loading thread (the nginx worker's, for LuaJIT's
// ffi.load and lua-resty-ffi alike), so that no child can exit unseen
// between loading and the first init call. Priority 101 runs it before the
// library's default-priority constructors, among them the Go runtime's,
// whose signal set-up rewrites dispositions it finds (adding SA_ONSTACK)
// and must see ours, not race with it.
// QRPC_NO_SIGNAL_FORWARD=1 in the environment turns the forwarders off
// (nginx passes it to workers only with an "env QRPC_NO_SIGNAL_FORWARD;"
// line); the test host uses it to show what they prevent.
static int qrpc_fwd_disabled;

__attribute__((constructor(101))) static void qrpc_ctor(void) {
	const char *e = getenv("QRPC_NO_SIGNAL_FORWARD");
	qrpc_fwd_disabled = e != NULL && e[0] == '1';
	qrpc_install_forwarders();
}

static int qrpc_install_forwarders(void) {
	if (qrpc_host_tid != 0 || qrpc_fwd_disabled) return 0;
	qrpc_host_tid = (pid_t)syscall(SYS_gettid);
	int n = 0;
	for (size_t i = 0; i < sizeof qrpc_fwd_signals / sizeof qrpc_fwd_signals[0]; i++) {
		int sig = qrpc_fwd_signals[i];
		struct sigaction cur;
		if (sigaction(sig, NULL, &cur) != 0) continue;
		if (cur.sa_flags & SA_SIGINFO) {
			if (cur.sa_sigaction == NULL || cur.sa_sigaction == qrpc_forward) continue;
		} else if (cur.sa_handler == SIG_DFL || cur.sa_handler == SIG_IGN) {
			continue; // the kernel applies those to the whole process anyway
		}
		qrpc_prev[sig] = cur;
		struct sigaction sa = cur;
		sa.sa_sigaction = qrpc_forward;
		// SA_ONSTACK: on a Go thread the handler must run on the signal
		// stack Go sets up, not on a small goroutine stack.
		sa.sa_flags = (cur.sa_flags | SA_SIGINFO | SA_ONSTACK) & ~SA_RESETHAND;
		if (sigaction(sig, &sa, NULL) == 0) n++;
	}
	return n;
}
*/
import "C"

// InstallSignalForwarders routes asynchronous signals to the calling
// thread (see the C comment above). Only the exports call it, on the nginx
// thread: in a Go program (tests) the handlers are Go's own.
func InstallSignalForwarders() int { return int(C.qrpc_install_forwarders()) }
