/* What the two C helpers (mpi/_direct.c, shm/_pair.c) share: the monotonic clock and
 * the idle turn of a bounded spin.
 *
 * A spin polls until its work is done or its slice of time is over. Each idle turn
 * yields the core every `yield_every` turns (0: never), so that where ranks outnumber
 * cores the rank being waited for gets to run, and reads the clock only once per
 * POLLS_PER_CLOCK turns, since a clock read costs more than a poll.
 */
#ifndef HPCCOMM_SPIN_H
#define HPCCOMM_SPIN_H

#include <sched.h>
#include <time.h>

#define POLLS_PER_CLOCK 64

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    double end;       /* when the slice is over (now() seconds) */
    long yield_every; /* idle turns between two sched_yield() calls; 0: never */
    long idle;        /* idle turns since the last yield */
    unsigned polls;   /* idle turns since the last clock read */
} spin_t;

static inline spin_t spin_start(double slice, long yield_every)
{
    spin_t spin = {now() + slice, yield_every, 0, 0};
    return spin;
}

/* One idle turn; true once the slice is over. */
static inline int spin_idle(spin_t *spin)
{
    if (spin->yield_every > 0 && ++spin->idle >= spin->yield_every) {
        spin->idle = 0;
        sched_yield();
    }
    if (++spin->polls == POLLS_PER_CLOCK) {
        spin->polls = 0;
        if (now() > spin->end)
            return 1;
    }
    return 0;
}

#endif
