/*
 * The objects the net plugin handed NCCL and has not yet taken back: comms, listen comms and
 * registrations. A second close or deregMr of one is refused by membership here, before the
 * freed object is read (its magic or ops word would be read from freed memory otherwise).
 * Checked at the calls that free (close*, deregMr), not on the data path.
 */
#ifndef MK_NET_LIVE_H_
#define MK_NET_LIVE_H_

/* 0, or -ENOMEM (the object then stays unknown: its close or deregMr will be refused). */
int mk_net_live_add(const void* p);
/* 0 when p was live (it no longer is), -ENOENT when it was not. */
int mk_net_live_take(const void* p);
/* Live objects now (tests). */
unsigned long mk_net_live_count(void);

#endif /* MK_NET_LIVE_H_ */
