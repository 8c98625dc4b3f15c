/*
 * The goodbye that ends a communicator's cross-node state (xnode.h), with no out-of-band
 * agreement (a collective there would hang on a dead peer). Plain C over the queue and the
 * proxy, so that the loopback suite runs it with a CPU stand-in for the kernel.
 */
#include "xnode.h"

#include <errno.h>

#include "proxy.h"

#define MK_XN_BYE_COMPLETION_NS 2000000000ull /* after the peers' byes: our own, briefly */

int mk_xn_goodbye(struct mk_proxy* p, struct mk_proxy_producer* prod, const uint64_t* flags,
                  int rank, int nranks, const unsigned char* remote, uint64_t timeout_ns) {
  for (int peer = 0; peer < nranks; peer++) {
    const struct mk_proxy_desc bye = mk_xn_bye_desc(rank, peer);
    const int rc =
        remote[peer] && peer != rank ? mk_proxy_publish(prod, &bye, timeout_ns, NULL) : 0;
    if (rc) return rc;
  }
  mk_proxy_peers_leaving(p);
  for (int peer = 0; peer < nranks; peer++) {
    if (!remote[peer] || peer == rank) continue;
    const uint64_t word = MK_XN_BYE0 + (uint64_t)peer;
    int rc = mk_proxy_wait_flag(prod->q, flags + word, word * 8, 1, timeout_ns, rank, 0);
    if (rc) return rc;
  }
  /* Every peer has our bye only once it completed: a peer still waiting for it must not see
   * our connections close first. Bounded briefly: the last peer may already be closing. */
  if (prod->tail) mk_proxy_wait_completed(prod, prod->tail - 1, MK_XN_BYE_COMPLETION_NS);
  return 0;
}
