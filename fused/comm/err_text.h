/* The account of a fused kernel's error record (gemm.h struct mk_gemm_error) that
 * ncclMkCommGetAsyncError returns and the WARN prints: which op, what its wait was for. */
#ifndef MK_ERR_TEXT_H_
#define MK_ERR_TEXT_H_

#include <stddef.h>

#include "gemm.h"

/* The record's op (1 .. 7, op_check.h enum mk_op_id; 0 when not one). */
unsigned mk_err_tag_op(unsigned tag);

/* One line, NUL-terminated in out[len]: "rank R: NAME (op 0xN) timed out WHERE waiting for
 * flag F: expected E, seen S", WHERE "at tile N" or what a wait that is not a tile's waited
 * for; a MoE dispatch that received more rows than it may says so instead. Returns the length
 * it wanted (snprintf's). */
int mk_err_record_text(int rank, const struct mk_gemm_error* e, char* out, size_t len);

#endif /* MK_ERR_TEXT_H_ */
