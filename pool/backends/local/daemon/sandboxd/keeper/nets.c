/*
 * A keeper's network namespaces for its next instances: new ones the daemon made
 * ahead (netstock.c), then emptied ones of dead instances, reused only when
 * proven as empty as a new one (netproof.c): creating and tearing one down is
 * the dearest part of an instance. A strict episode starts two instances (the
 * agent's, the verifier's) and frees two, so two are kept.
 */
#include "sandboxd.h"

enum { SPARE_NETS = 2 };
static int spare_nets[SPARE_NETS] = {-1, -1};
static int spare_net_is_new[SPARE_NETS]; /* never held a process: not a reuse */
static int nspare_nets;

/* Keep up to two new namespaces (fds) the daemon handed over; the rest are not taken. */
void nets_keep_new(const int *nets, int n) {
    for (int i = 0; i < n && nspare_nets < SPARE_NETS; i++) {
        spare_net_is_new[nspare_nets] = 1;
        spare_nets[nspare_nets++] = nets[i];
    }
}

/* Keep a dead instance's network namespace (an fd on it) for a later instance, if empty;
 * otherwise its last reference goes in the janitor. */
void nets_recycle(int net) {
    if (net < 0) return;
    if (nspare_nets < SPARE_NETS && net_is_empty(net)) {
        spare_net_is_new[nspare_nets] = 0;
        spare_nets[nspare_nets++] = net;
        return;
    }
    janitor_send('N', "", net);
}

/* A network namespace for a new instance (its fd), or -1: the instance makes its own. *reused:
 * whether it is a dead instance's. */
int nets_take(int *reused) {
    if (nspare_nets == 0) return -1;
    int net = spare_nets[0];
    *reused = !spare_net_is_new[0];
    --nspare_nets;
    memmove(spare_nets, spare_nets + 1, sizeof *spare_nets * (size_t)nspare_nets);
    memmove(spare_net_is_new, spare_net_is_new + 1, sizeof *spare_net_is_new * (size_t)nspare_nets);
    spare_nets[nspare_nets] = -1;
    return net;
}

/* A network namespace no one will use again: its last reference goes in the janitor. */
void nets_drop(int net) {
    if (net >= 0) janitor_send('N', "", net);
}

/* In a child the keeper forks (an instance): close the kept namespaces. */
void nets_forget(void) {
    for (int i = 0; i < nspare_nets; i++) close(spare_nets[i]);
}
