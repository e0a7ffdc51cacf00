/* Shared by the differential programs: each prints one line per observation, the same
   lines its twin in examples/differential.rs prints with offload::omp. */
#include <omp.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Element `i` of the device copy of the mapped host array `h` on device `dev`. */
__attribute__((unused)) static int device_value(int *h, int i, int dev) {
  int v = -999;
  void *d = omp_get_mapped_ptr(h, dev);
  if (d) omp_target_memcpy(&v, d, sizeof v, 0, (size_t)i * sizeof v, omp_get_initial_device(), dev);
  return v;
}

#define SAY(...) (printf(__VA_ARGS__), printf("\n"))

/* Runs the statements (which print their line, starting with "<who>: <what>") in a child
   process, so that a libomptarget fatal error there ends the child only: then
   "<who>: <what>: fails" is printed instead, as the twin prints for an error, and the
   program goes on. */
#define ATTEMPT(who, what, ...)                                                                  \
  do {                                                                                       \
    fflush(stdout);                                                                          \
    pid_t pid_ = fork();                                                                     \
    if (pid_ == 0) {                                                                         \
      __VA_ARGS__;                                                                           \
      fflush(stdout);                                                                        \
      _exit(0);                                                                              \
    }                                                                                        \
    int status_ = 1;                                                                         \
    if (pid_ < 0 || waitpid(pid_, &status_, 0) < 0 || !WIFEXITED(status_) ||                 \
        WEXITSTATUS(status_) != 0)                                                           \
      SAY("%s: %s: fails", who, what);                                                             \
  } while (0)
