/* bench/allreduce/p2p_tcp: the raw TCP point-to-point reference of bench/allreduce/run.
 *
 * Two threads ("ranks" 0 and 1), each with one end of a TCP connection over 127.0.0.1
 * (TCP_NODELAY, non-blocking), send BYTES to each other and receive BYTES from each other at
 * once, driven by poll(): the best a ring step between two ranks could do on this transport.
 * Like MPI's progress engine it never sleeps (poll() with a zero timeout), and it moves at most
 * 256 KiB per send()/recv() call (measured here: 1 MiB exchanges take twice as long with
 * unbounded calls, as the copies leave the cache; 64 KiB calls are slower again).
 * The time is that of one exchange, the maximum over the two threads; per-direction bandwidth
 * is BYTES / time.  --bind pins the threads to two different processors; --cc chooses the
 * congestion control (the driver passes the DataChannel's choice).  See common.h.
 * Built by the driver at run time: cc -O2 -pthread -o p2p_tcp p2p_tcp.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

struct side {
  int rank;
  int fd;
  int cpu; /* -1: not pinned */
  const pe_args* args;
  char* sbuf;
  char* rbuf;
  double us[PE_MAX_SIZES][PE_MAX_REPS];
  long long wrong[PE_MAX_SIZES];
};

static pthread_barrier_t g_barrier;

static void die(const char* what) {
  fprintf(stderr, "p2p_tcp: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define CHUNK (256 * 1024)

static size_t min_chunk(size_t left) { return left < CHUNK ? left : CHUNK; }

/* Send and receive `bytes` at once: try both directions, poll() when neither could move. */
static void exchange(int fd, const char* sbuf, char* rbuf, size_t bytes) {
  size_t sent = 0, got = 0;
  while (sent < bytes || got < bytes) {
    int moved = 0;
    if (sent < bytes) {
      ssize_t k = send(fd, sbuf + sent, min_chunk(bytes - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0)
        sent += (size_t)k, moved = 1;
      else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        die("send");
    }
    if (got < bytes) {
      ssize_t k = recv(fd, rbuf + got, min_chunk(bytes - got), MSG_DONTWAIT);
      if (k > 0)
        got += (size_t)k, moved = 1;
      else if (k == 0) {
        errno = ECONNRESET;
        die("recv");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        die("recv");
    }
    if (moved) continue;
    struct pollfd p = {fd, (short)((sent < bytes ? POLLOUT : 0) | (got < bytes ? POLLIN : 0)), 0};
    if (poll(&p, 1, 0) < 0 && errno != EINTR) die("poll");
  }
}

static void* run_side(void* arg) {
  struct side* s = arg;
  const pe_args* a = s->args;
  int peer = s->rank ^ 1;
  if (s->cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(s->cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  for (int z = 0; z < a->nsizes; z++) {
    size_t bytes = a->bytes[z];
    for (size_t i = 0; i < bytes; i++) s->sbuf[i] = (char)(s->rank * 31 + i % 251);
    pthread_barrier_wait(&g_barrier);
    double t0 = now_us();
    exchange(s->fd, s->sbuf, s->rbuf, bytes);
    s->us[z][0] = now_us() - t0;
    s->wrong[z] = 0;
    for (size_t i = 0; i < bytes; i++) s->wrong[z] += s->rbuf[i] != (char)(peer * 31 + i % 251);
    for (int r = 1; a->bucket && r < a->reps; r++) { /* back to back, each timed */
      t0 = now_us();
      exchange(s->fd, s->sbuf, s->rbuf, bytes);
      s->us[z][r] = now_us() - t0;
    }
    if (a->bucket) continue;
    for (int k = 0; k < a->iters[z]; k++) exchange(s->fd, s->sbuf, s->rbuf, bytes);
    for (int r = 0; r < a->reps; r++) {
      pthread_barrier_wait(&g_barrier);
      t0 = now_us();
      for (int k = 0; k < a->iters[z]; k++) exchange(s->fd, s->sbuf, s->rbuf, bytes);
      s->us[z][r] = (now_us() - t0) / a->iters[z];
    }
  }
  return NULL;
}

static int set_cc(int fd, const char* name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) == 0;
}

/* The congestion control of `fd` as --cc asks (auto: BBR becomes cubic, else reno, as the
 * DataChannel's default does); returns the one in use. */
static const char* apply_cc(int fd, const char* want, char* now, socklen_t len) {
  if (want && !strcmp(want, "auto")) {
    if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, now, &len) == 0 && !strcmp(now, "bbr") &&
        !set_cc(fd, "cubic"))
      set_cc(fd, "reno");
  } else if (want && strcmp(want, "system") != 0 && !set_cc(fd, want)) {
    die("--cc: setsockopt(TCP_CONGESTION)");
  }
  len = 31;
  memset(now, 0, 32);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, now, &len) != 0) strcpy(now, "?");
  return now;
}

/* A connected pair of TCP sockets over 127.0.0.1. */
static void connect_pair(int fds[2]) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
  socklen_t len = sizeof addr;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0 || bind(lfd, (struct sockaddr*)&addr, sizeof addr) < 0 || listen(lfd, 1) < 0 ||
      getsockname(lfd, (struct sockaddr*)&addr, &len) < 0)
    die("listen on 127.0.0.1");
  fds[1] = socket(AF_INET, SOCK_STREAM, 0);
  if (fds[1] < 0 || connect(fds[1], (struct sockaddr*)&addr, sizeof addr) < 0) die("connect");
  fds[0] = accept(lfd, NULL, NULL);
  if (fds[0] < 0) die("accept");
  close(lfd);
  for (int i = 0; i < 2; i++) {
    int one = 1;
    if (setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
  }
}

/* The first two processors this process may run on, or -1. */
static void pick_cpus(int cpus[2]) {
  cpu_set_t set;
  cpus[0] = cpus[1] = -1;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
    if (CPU_ISSET(c, &set)) cpus[k++] = c;
  if (cpus[1] < 0) cpus[0] = -1;
}

int main(int argc, char** argv) {
  static struct side sides[2];
  pe_args a;
  if (pe_parse_args(argc, argv, &a) != 0) return 2;
  int fds[2], cpus[2] = {-1, -1};
  connect_pair(fds);
  char cc[32] = {0};
  for (int i = 0; i < 2; i++) apply_cc(fds[i], a.cc, cc, sizeof cc - 1);
  if (a.bind) pick_cpus(cpus);
  size_t maxb = pe_max_bytes(&a);
  pthread_barrier_init(&g_barrier, NULL, 2);
  for (int r = 0; r < 2; r++) {
    sides[r] = (struct side){.rank = r,
                             .fd = fds[r],
                             .cpu = cpus[r],
                             .args = &a,
                             .sbuf = malloc(maxb),
                             .rbuf = malloc(maxb)};
    if (!sides[r].sbuf || !sides[r].rbuf) die("malloc");
  }
  printf("@@INFO ranks=2 mode=p2p transport=tcp-127.0.0.1 bound=%s cc=%s\n",
         cpus[0] >= 0 ? "yes" : "no", cc);
  pthread_t th;
  if (pthread_create(&th, NULL, run_side, &sides[1]) != 0) die("pthread_create");
  run_side(&sides[0]);
  pthread_join(th, NULL);
  for (int z = 0; z < a.nsizes; z++) {
    double us[PE_MAX_REPS];
    for (int r = 0; r < a.reps; r++)
      us[r] = sides[0].us[z][r] > sides[1].us[z][r] ? sides[0].us[z][r] : sides[1].us[z][r];
    pe_print_row(a.bytes[z], a.bytes[z] / sizeof(float), sides[0].wrong[z] + sides[1].wrong[z], us,
                 a.reps);
  }
  return 0;
}
