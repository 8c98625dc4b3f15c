/*
 * The release's goodbye (mk_xn_goodbye) across three ranks, where one rank leaves first: rank 0
 * has every bye early (rank 2 sends it its bye 0.5 s ahead of the rest) and closes, while rank
 * 1 still waits for rank 2's bye. Rank 0's close reaches rank 1's and rank 2's proxies as a
 * transport error while they are leaving; it must close only that peer: their threads go on, so
 * every bye to a peer still there completes and every goodbye returns 0 with no proxy error.
 * (Before, the first close stopped a proxy's thread for every peer: rank 2's descriptors were
 * never all retired and its goodbye waited out its 2 s bound; a rank whose thread had to land a
 * later bye waited for it in vain: "not every remote rank said goodbye".)
 * Ranks 0 and 2 are threads of the parent process, rank 1 is the child.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lb_px.h"
#include "xnode.h"

#define BYE3_RANKS 3
#define BYE3_BOUND_NS (5 * SEC) /* a goodbye's bound: a lost bye fails well inside the case */
#define BYE3_LATE_US 500000     /* rank 2's bye to rank 1 comes this much after its bye to 0 */

static int bye3_make(struct px* x, int rank, int dev) {
  return px_make(x, rank, BYE3_RANKS, dev, 16, 8, 64u << 10, MK_XN_FLAG_WORDS);
}

struct bye3_thread {
  struct px* x;
  const struct mk_proxy_addr* addrs;
  int rc;
};

static void* bye3_connect_main(void* arg) {
  struct bye3_thread* t = arg;
  t->rc = mk_proxy_connect(t->x->p, t->addrs);
  return NULL;
}

/* The goodbye of one rank, then its proxy's stop; rank 2 sends rank 0 its bye first. */
static void* bye3_goodbye_main(void* arg) {
  struct bye3_thread* t = arg;
  struct px* x = t->x;
  const unsigned char remote[BYE3_RANKS] = {1, 1, 1};
  if (x->rank == 2) {
    const struct mk_proxy_desc bye = mk_xn_bye_desc(2, 0);
    t->rc = mk_proxy_publish(&x->prod, &bye, WAIT_NS, NULL);
    mk_proxy_peers_leaving(x->p);
    usleep(BYE3_LATE_US);
  }
  const double t0 = lb_now();
  const int bye = t->rc ? t->rc : mk_xn_goodbye(x->p, &x->prod, x->flags, x->rank, BYE3_RANKS, remote, BYE3_BOUND_NS);
  char msg[256] = "";
  const int err = mk_proxy_error(x->p, msg, sizeof msg);
  /* every descriptor it published was retired (completed, or dropped for the closed peer): the
   * thread went on, and the goodbye did not wait out its bound for a stopped one */
  const uint64_t retired = __atomic_load_n(&x->q->completed, __ATOMIC_ACQUIRE);
  printf("  [rank %d] goodbye %d after %.3f s; proxy error %d %s; %llu of %llu descriptors retired\n", x->rank,
         bye, lb_now() - t0, err, msg, (unsigned long long)retired, (unsigned long long)x->prod.tail);
  const int stop = mk_proxy_stop(x->p);
  t->rc = bye ? bye : err ? err : retired < x->prod.tail ? -EPIPE : stop;
  return NULL;
}

static int bye3_expect_all(struct bye3_thread* t, int n) {
  int bad = 0;
  for (int i = 0; i < n; i++) bad += t[i].rc != 0;
  return bad;
}

int lb_bye3_parent(struct lb_ctx* ctx) {
  struct px x[BYE3_RANKS] = {{0}};
  struct mk_proxy_addr addrs[BYE3_RANKS];
  struct mk_proxy_keys keys[BYE3_RANKS];
  for (int r = 0; r < BYE3_RANKS; r += 2) {
    LB_OK(bye3_make(&x[r], r, ctx->dev));
    LB_OK(mk_proxy_addr(x[r].p, &addrs[r]));
    px_tell(ctx, &addrs[r], sizeof addrs[r]);
  }
  px_hear(ctx, &addrs[1], sizeof addrs[1]);
  struct bye3_thread t[2] = {{&x[0], addrs, 0}, {&x[2], addrs, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, bye3_connect_main, &t[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  LB_EXPECT(bye3_expect_all(t, 2) == 0);
  for (int r = 0; r < BYE3_RANKS; r += 2) {
    LB_OK(mk_proxy_keys(x[r].p, &keys[r]));
    px_tell(ctx, &keys[r], sizeof keys[r]);
  }
  px_hear(ctx, &keys[1], sizeof keys[1]);
  for (int r = 0; r < BYE3_RANKS; r += 2) LB_OK(mk_proxy_start(x[r].p, keys));
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, bye3_goodbye_main, &t[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  LB_EXPECT(bye3_expect_all(t, 2) == 0);
  px_free(&x[0]), px_free(&x[2]);
  return 0;
}

int lb_bye3_child(struct lb_ctx* ctx) {
  struct px x = {0};
  struct mk_proxy_addr addrs[BYE3_RANKS];
  struct mk_proxy_keys keys[BYE3_RANKS];
  LB_OK(bye3_make(&x, 1, ctx->dev));
  LB_OK(mk_proxy_addr(x.p, &addrs[1]));
  px_hear(ctx, &addrs[0], sizeof addrs[0]);
  px_hear(ctx, &addrs[2], sizeof addrs[2]);
  px_tell(ctx, &addrs[1], sizeof addrs[1]);
  LB_OK(mk_proxy_connect(x.p, addrs));
  LB_OK(mk_proxy_keys(x.p, &keys[1]));
  px_hear(ctx, &keys[0], sizeof keys[0]);
  px_hear(ctx, &keys[2], sizeof keys[2]);
  px_tell(ctx, &keys[1], sizeof keys[1]);
  LB_OK(mk_proxy_start(x.p, keys));
  struct bye3_thread t = {&x, addrs, 0};
  bye3_goodbye_main(&t);
  fflush(stdout); /* the child ends in _exit */
  LB_EXPECT(t.rc == 0);
  px_free(&x);
  return 0;
}
