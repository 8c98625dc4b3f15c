/* The verbs transport's pure pieces: NCCL_MK_IB_HCA selection, port speed, wr_id encoding,
 * a receive's sizes bounded by what it offered, and the wire layouts both ends must agree
 * on. No device needed. */
#include <errno.h>
#include <stddef.h>

#include "mk_test.h"
#include "ib/ib.h"

int main(void) {
  CHECK(ib_hca_match("", "mlx5_0", 1));                /* empty: everything */
  CHECK(ib_hca_match("mlx5", "mlx5_10", 1));           /* prefix */
  CHECK(!ib_hca_match("=mlx5_1", "mlx5_10", 1));       /* exact */
  CHECK(ib_hca_match("=mlx5_1", "mlx5_1", 2));
  CHECK(ib_hca_match("mlx5_0:1,rxe0", "rxe0", 1));
  CHECK(!ib_hca_match("mlx5_0:1", "mlx5_0", 2));       /* port filter */
  CHECK(ib_hca_match("mlx5_0:2", "mlx5_0", 2));
  CHECK(!ib_hca_match("^rxe", "rxe1", 1));             /* exclusion */
  CHECK(ib_hca_match("^rxe", "mlx5_0", 1));
  CHECK(!ib_hca_match("^=mlx5_0", "mlx5_0", 1));
  CHECK(ib_hca_match("^=mlx5_0", "mlx5_01", 1));

  struct ibv_port_attr a = {.active_speed = 128, .active_width = 2}; /* NDR x4 */
  CHECK_EQ(ib_port_speed(&a), 400000);
  a.active_speed = 64; a.active_width = 16;                         /* HDR x2 */
  CHECK_EQ(ib_port_speed(&a), 100000);
  a.active_speed = 1; a.active_width = 1;                           /* SDR x1 (rxe) */
  CHECK_EQ(ib_port_speed(&a), 2500);

  /* a receive's sizes as the peer reports them: never more than each buffer offered */
  struct ib_cts posted[3] = {{.size = 4096}, {.size = 100}, {.size = 0}};
  uint64_t reported[3] = {4096, 7, 0};
  size_t taken[3] = {1, 1, 1};
  CHECK_EQ(ib_recv_sizes_take(reported, posted, 3, taken), 0);
  CHECK(taken[0] == 4096 && taken[1] == 7 && taken[2] == 0);
  reported[1] = 101; /* one byte past the second buffer */
  CHECK_EQ(ib_recv_sizes_take(reported, posted, 3, taken), -EPROTO);
  reported[1] = 7, reported[2] = 1; /* anything into an empty buffer */
  CHECK_EQ(ib_recv_sizes_take(reported, posted, 3, taken), -EPROTO);
  reported[0] = (uint64_t)1 << 30; /* a corrupt peer's 1 GiB for 4 KiB */
  CHECK_EQ(ib_recv_sizes_take(reported, posted, 1, taken), -EPROTO);

  for (int k = IB_WR_GROUP; k <= IB_WR_NONE; k++) {
    uint64_t id = ib_wr_id(k, 0xfffffffeu);
    CHECK_EQ(ib_wr_kind(id), k);
    CHECK_EQ(ib_wr_idx(id), 0xfffffffeu);
  }
  CHECK_EQ(sizeof(struct ib_cts), 64);
  CHECK_EQ(offsetof(struct ib_cts, marker) + 4 + 16, 64); /* the marker closes the entry */
  CHECK(IB_MAX_QPS >= 8 * IB_MAX_RAILS);                   /* NCCL_MK_IB_QPS max x rails */
  CHECK(sizeof(struct ib_hello) < 4096);
  return MK_TEST_RESULT();
}
