/* arena.h: dhtsim-scale's memory in one region at a fixed address, so that
 * a whole simulation can be written to a file and carried on by a later
 * process (checkpoint and resume).
 *
 * A 100,000-node day takes longer than the processes on our machines live,
 * and the simulation's state (hundreds of thousands of DHT cores, their
 * lookups in flight with their callbacks, the event queues) is a graph of
 * pointers.  Rather than teach every structure to serialize itself, the
 * tool replaces malloc for the whole process: once arena_start() ran, every
 * allocation (the DHT cores', the simulator's, libc's own) comes from one
 * region mapped at ARENA_BASE.  arena_save() writes the region's used part
 * to a file; arena_load() maps the region at the same address in a new
 * process and reads it back, so every pointer in it is valid again.
 * Pointers from the region into the program (callbacks, string literals)
 * stay valid because both processes run the same binary with address
 * randomization off (arena_fixed_layout); the file records the binary's
 * hash and where the program and its libraries were loaded, and a load
 * into anything else is refused.
 *
 * What the region does not hold is not saved: the program's static
 * variables, the stack, thread-local storage, open files.  A caller saves
 * at a point where its state is reachable from one root pointer (given to
 * arena_save, returned by arena_load) and keeps per-process things (file
 * names, budgets, the log level) outside it.
 *
 * The allocator serves sizes up to 32 KiB from 48 size classes in 64 KiB
 * pages (free lists, no headers) and bigger blocks as runs of pages.  It is
 * not thread-safe; dhtsim-scale runs on one thread.  In a build with
 * AddressSanitizer, which replaces malloc itself, the arena is compiled
 * out: arena_start fails and nothing can be saved.
 */
#ifndef BEE_DHTSIM_ARENA_H
#define BEE_DHTSIM_ARENA_H

#include <stdbool.h>
#include <stddef.h>

/* Makes sure the process runs with address randomization off, re-executing
 * itself (/proc/self/exe with argv) with it turned off when needed.
 * Returns 0 when it is off, or -errno when it cannot be turned off (the
 * process is not replaced then). */
int arena_fixed_layout(char **argv);

/* Maps the region and routes malloc to it from now on.  Returns 0, or
 * -errno (the region's address is taken, or this build has no arena);
 * malloc then stays libc's. */
int arena_start(void);

/* Whether arena_start or arena_load succeeded. */
bool arena_active(void);

/* Bytes of the region in use (what a save writes, about). */
size_t arena_used(void);

/* Writes the region and root to path (through path.tmp, renamed once it
 * is complete and synced, so a crash leaves the previous file).  Nothing
 * may allocate while it runs.  Returns 0, or -errno with *why saying what
 * failed. */
int arena_save(const char *path, void *root, const char **why);

/* Reads a file written by arena_save into the region (which must not have
 * been started) and routes malloc to it.  Returns the root, or NULL with
 * *why saying why: unreadable, not a checkpoint, truncated, corrupt (its
 * hash), written by another build of the program, or with the program or
 * its libraries at other addresses.  On failure malloc stays libc's. */
void *arena_load(const char *path, const char **why);

#endif /* BEE_DHTSIM_ARENA_H */
