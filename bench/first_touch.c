/*
 * first_touch.c: what a process pays the first time it reads a page of
 * shared memory another process wrote, and what it pays the second time.
 *
 * The parent writes MB megabytes of MAP_SHARED memory, as a backend fills
 * shared buffers or the gate store; a forked child, with its page tables
 * filled first (MADV_POPULATE_READ, so no fault is counted), reads one
 * word of each of up to 4,000 random pages, 50 us apart so that the
 * caches and TLB go cold between reads, then the same pages again.  On
 * hardware paging both reads cost a cache and TLB miss; under shadow
 * paging (a PVM guest) the first one also waits for the hypervisor to
 * build its own entry for the page.  bench/run.sh prints the result in
 * the machine's description, since it bounds every figure in which new
 * backends touch much shared memory (notes.md, 2026-11-29).
 *
 * Usage: first_touch [MB]; prints "FIRST_US SECOND_US".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define PAGE 4096
#define READS 4000

static double
now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Read one word of each of the pages, 50 us apart; the mean time a read. */
static double
read_pages(const volatile char *p, const size_t *pages, int n)
{
	double		total = 0;
	uint64_t	sum = 0;
	int			i;

	for (i = 0; i < n; i++)
	{
		double		t0 = now_us();

		sum += *(const volatile uint64_t *) (p + pages[i] * PAGE + (pages[i] % 63) * 64);
		total += now_us() - t0;
		usleep(50);
	}
	return sum == UINT64_MAX ? -1 : total / n;
}

int
main(int argc, char **argv)
{
	size_t		mb = argc > 1 ? (size_t) atol(argv[1]) : 64;
	size_t		npages = mb * 1024 * 1024 / PAGE;
	char	   *p;
	size_t	   *pages;
	char	   *taken;
	uint64_t	x = 88172645463325252ULL;
	int			n = 0;
	int			fds[2];
	pid_t		child;
	double		r[2];

	if (npages < 2 * READS)
		return 2;
	p = mmap(NULL, npages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pages = malloc(READS * sizeof(size_t));
	taken = calloc(npages, 1);
	if (p == MAP_FAILED || pages == NULL || taken == NULL || pipe(fds) != 0)
		return 2;
	memset(p, 1, npages * PAGE);
	while (n < READS)
	{
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (!taken[x % npages])
		{
			taken[x % npages] = 1;
			pages[n++] = x % npages;
		}
	}
	child = fork();
	if (child < 0)
		return 2;
	if (child == 0)
	{
		(void) madvise(p, npages * PAGE, MADV_POPULATE_READ);
		r[0] = read_pages(p, pages, READS);
		r[1] = read_pages(p, pages, READS);
		_exit(write(fds[1], r, sizeof(r)) == sizeof(r) ? 0 : 1);
	}
	if (read(fds[0], r, sizeof(r)) != sizeof(r) || waitpid(child, NULL, 0) != child)
		return 2;
	printf("%.2f %.2f\n", r[0], r[1]);
	return 0;
}
