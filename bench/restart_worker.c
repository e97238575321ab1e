/* Worker for bench/restart.  Appends "<event> <rank> <restart> <CLOCK_REALTIME seconds>" to
 * the file in argv[1]: "start" when it begins; rank 1 of restart 0 then waits argv[2] seconds,
 * appends "fail" and exits 1.  Every other worker stays up argv[3] seconds and exits 0. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void record(const char* path, const char* ev, int rank, int restart) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[128];
  int n = snprintf(line, sizeof line, "%s %d %d %lld.%09ld\n", ev, rank, restart,
                   (long long)ts.tv_sec, ts.tv_nsec);
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0 || write(fd, line, (size_t)n) != n) _exit(2);
  close(fd);
}

static void nap(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const char* r = getenv("RANK");
  const char* c = getenv("TORCHELASTIC_RESTART_COUNT");
  int rank = r ? atoi(r) : -1, restart = c ? atoi(c) : -1;
  record(argv[1], "start", rank, restart);
  if (rank == 1 && restart == 0) {
    nap(atof(argv[2]));
    record(argv[1], "fail", rank, restart);
    return 1;
  }
  nap(atof(argv[3]));
  return 0;
}
