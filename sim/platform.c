/* The cluster as a SimGrid platform (XML, DTD 4.1); docs/simulator.md
 * explains the layout. In short:
 *
 * - every device is a host "dev<d>" at its kind's speed, with a
 *   full-duplex port (SPLITDUPLEX link "dev<d>_port": intra bandwidth, half
 *   the intra latency) to its node's switch (router "node<k>_sw"): a
 *   transfer inside a node crosses the sender's port up and the receiver's
 *   port down, so it takes intra latency + bytes / intra bandwidth alone,
 *   and a device talking to two peers shares its port;
 * - a node whose devices share cores (shared_cores_per_node) has a host
 *   "node<k>_cpu" with that many cores, where its devices' computes run;
 * - every node has one NIC link "node<k>_nic" (SPLITDUPLEX, nics_per_node x
 *   nic_bandwidth per direction, half of inter - intra latency) from its
 *   switch to the rest of the cluster;
 * - nodes are grouped in pods of about PS_SIM_POD_DEVICES devices, each a
 *   zone routed by SimGrid's cached Dijkstra over those links (gateway
 *   "pod<p>_gw"); pods hang off a tree of "Full" zones whose routes add one
 *   zero-latency FATPIPE link per route (SimGrid refuses empty routes): a
 *   non-blocking core, as a full-bisection fat-tree or one big switch.
 *
 * Why this shape (SimGrid 3.32, measured at 16k devices): its FAT_TREE
 * cluster loads in time quadratic in the hosts (6.4 s); one zone per node
 * costs as much again, because sealing a zone walks every host of the
 * platform; one Full zone routing between all nodes stores a route per
 * pair. Pods keep zones few (128 at 16k devices) and routes linear. All
 * links sit in a first child zone "links" because SimGrid resolves a link
 * name by a depth-first search of the zones: there it is found at once. */
#include <math.h>

#include "sim/sim_internal.h"

/* Devices per pod (whole nodes; at least one node), and children per zone
 * of the tree above the pods: routes per zone grow as its square, zones as
 * N / fan-out. A wide fan-out keeps the tree one level deep up to 256 pods
 * (32k devices): a link of an upper level carries every flow between two
 * of its subtrees and joins them in one component of SimGrid's solver,
 * re-solved at each of their starts and ends (measured at 4096 devices:
 * 1.27x the wall time with a fan-out of 16; docs/simulator.md). */
#define PS_SIM_POD_DEVICES 128
#define PS_SIM_FANOUT 256

/* Extra latency of a NIC hop, so that port + NIC + NIC + port adds up to
 * the inter-node latency (never below an intra-node route). */
static double nic_latency_s(const ps_cluster *c)
{
    return fmax(0.0, c->inter.latency_s - c->intra.latency_s) / 2;
}

double ps_sim_route_latency_s(const ps_cluster *c, int a, int b)
{
    int dpn = c->devices_per_node;
    if (a / dpn == b / dpn)
        return c->intra.latency_s;
    return c->intra.latency_s + 2 * nic_latency_s(c);
}

typedef struct layout {
    const ps_cluster *c;
    FILE *f;
    int nodes_per_pod, pods;
} layout;

static void write_links(const layout *l, int node_lo, int node_hi)
{
    const ps_cluster *c = l->c;
    int dpn = c->devices_per_node;
    for (int d = node_lo * dpn; d < node_hi * dpn; d++)
        fprintf(l->f,
                "<link id=\"dev%d_port\" bandwidth=\"%.17gBps\" latency=\"%.17gs\" "
                "sharing_policy=\"SPLITDUPLEX\"/>\n",
                d, c->intra.bandwidth_bytes_per_s, c->intra.latency_s / 2);
    for (int n = node_lo; n < node_hi && c->nodes > 1; n++)
        fprintf(l->f,
                "<link id=\"node%d_nic\" bandwidth=\"%.17gBps\" latency=\"%.17gs\" "
                "sharing_policy=\"SPLITDUPLEX\"/>\n",
                n, c->inter.nics_per_node * c->inter.nic_bandwidth_bytes_per_s, nic_latency_s(c));
}

/* The children of pod range [lo, hi): ranges of `span` pods. */
static int child_span(int lo, int hi)
{
    int span = 1;
    while ((long long)span * PS_SIM_FANOUT < hi - lo)
        span *= PS_SIM_FANOUT;
    return span;
}

/* The core links of every zone of the tree over pods [lo, hi): one per
 * route between two children (and from each child up and down), never one
 * shared by all: SimGrid's solver re-solves every flow connected to a
 * changed one through shared links, and one core link would connect every
 * flow between pods (measured: 1.6x the CPU per event at 4096 devices). */
static void write_core_links(FILE *f, int lo, int hi, bool root)
{
    if (hi - lo <= 1)
        return;
    int span = child_span(lo, hi);
    for (int a = lo; a < hi; a += span) {
        for (int b = lo; b < hi; b += span)
            if (b != a)
                fprintf(f,
                        "<link id=\"group%d_%d_core%d_%d\" bandwidth=\"1e18Bps\" latency=\"0s\" "
                        "sharing_policy=\"FATPIPE\"/>\n",
                        lo, hi, a, b);
        for (int dir = 0; dir < 2 && !root; dir++)
            fprintf(f,
                    "<link id=\"group%d_%d_%s%d\" bandwidth=\"1e18Bps\" latency=\"0s\" "
                    "sharing_policy=\"FATPIPE\"/>\n",
                    lo, hi, dir ? "down" : "up", a);
    }
    for (int x = lo; x < hi; x += span) {
        int y = x + span < hi ? x + span : hi;
        write_core_links(f, x, y, false);
    }
}

static void write_pod(const layout *l, int pod, bool root)
{
    const ps_cluster *c = l->c;
    FILE *f = l->f;
    int dpn = c->devices_per_node, lo = pod * l->nodes_per_pod;
    int hi = lo + l->nodes_per_pod < c->nodes ? lo + l->nodes_per_pod : c->nodes;
    fprintf(f, "<zone id=\"pod%d\" routing=\"DijkstraCache\">\n", pod);
    for (int d = lo * dpn; d < hi * dpn; d++)
        fprintf(f, "<host id=\"dev%d\" speed=\"%.17gf\"/>\n", d,
                ps_device_kind_speed_flops_per_s(ps_cluster_device(c, d)));
    for (int n = lo; n < hi && ps_cluster_compute_share(c) > 1; n++) {
        /* the cores the node's devices share: computes run here (replay.c),
         * each on one core at most; no route reaches it */
        double speed = 0;
        for (int d = n * dpn; d < (n + 1) * dpn; d++)
            speed = fmax(speed, ps_device_kind_speed_flops_per_s(ps_cluster_device(c, d)));
        fprintf(f, "<host id=\"node%d_cpu\" speed=\"%.17gf\" core=\"%d\"/>\n", n, speed,
                c->shared_cores_per_node);
    }
    for (int n = lo; n < hi; n++)
        fprintf(f, "<router id=\"node%d_sw\"/>\n", n);
    if (c->nodes > 1)
        fprintf(f, "<router id=\"pod%d_gw\"/>\n", pod);
    if (root) /* else in the zone "links" */
        write_links(l, lo, hi);
    for (int n = lo; n < hi; n++) {
        for (int d = n * dpn; d < (n + 1) * dpn; d++)
            fprintf(f,
                    "<route src=\"dev%d\" dst=\"node%d_sw\" symmetrical=\"NO\"><link_ctn "
                    "id=\"dev%d_port\" direction=\"UP\"/></route>\n"
                    "<route src=\"node%d_sw\" dst=\"dev%d\" symmetrical=\"NO\"><link_ctn "
                    "id=\"dev%d_port\" direction=\"DOWN\"/></route>\n",
                    d, n, d, n, d, d);
        if (c->nodes > 1)
            fprintf(f,
                    "<route src=\"node%d_sw\" dst=\"pod%d_gw\" symmetrical=\"NO\"><link_ctn "
                    "id=\"node%d_nic\" direction=\"UP\"/></route>\n"
                    "<route src=\"pod%d_gw\" dst=\"node%d_sw\" symmetrical=\"NO\"><link_ctn "
                    "id=\"node%d_nic\" direction=\"DOWN\"/></route>\n",
                    n, pod, n, pod, n, n);
    }
    fprintf(f, "</zone>\n");
}

/* Zone name and gateway of the subtree of pods [lo, hi). */
static void subtree_names(int lo, int hi, char *zone, char *gw, size_t size)
{
    if (hi - lo == 1) {
        snprintf(zone, size, "pod%d", lo);
        snprintf(gw, size, "pod%d_gw", lo);
    } else {
        snprintf(zone, size, "group%d_%d", lo, hi);
        snprintf(gw, size, "group%d_%d_gw", lo, hi);
    }
}

static void write_route(FILE *f, const char *src, const char *dst, const char *gw_src,
                        const char *gw_dst, const char *core)
{
    fprintf(f,
            "<zoneRoute src=\"%s\" dst=\"%s\" gw_src=\"%s\" gw_dst=\"%s\" "
            "symmetrical=\"NO\"><link_ctn id=\"%s\"/></zoneRoute>\n",
            src, dst, gw_src, gw_dst, core);
}

/* The zone of pods [lo, hi): a pod, or a Full zone over its children. */
static void write_group(const layout *l, int lo, int hi, bool root)
{
    FILE *f = l->f;
    if (hi - lo == 1) {
        write_pod(l, lo, root);
        return;
    }
    char zone[64], gw[64], core[96], up[80];
    subtree_names(lo, hi, zone, gw, sizeof zone);
    snprintf(up, sizeof up, "%s_up", zone);
    fprintf(f, "<zone id=\"%s\" routing=\"Full\">\n", zone);
    if (root) {
        fprintf(f, "<zone id=\"links\" routing=\"None\">\n");
        write_links(l, 0, l->c->nodes);
        write_core_links(f, lo, hi, true);
        fprintf(f, "</zone>\n");
    }
    int span = child_span(lo, hi);
    for (int x = lo; x < hi; x += span)
        write_group(l, x, x + span < hi ? x + span : hi, false);
    if (!root) /* where routes to the rest of the cluster leave this group */
        fprintf(f, "<zone id=\"%s\" routing=\"Full\"><router id=\"%s\"/></zone>\n", up, gw);
    char a_zone[64], a_gw[64], b_zone[64], b_gw[64];
    for (int a = lo; a < hi; a += span) {
        subtree_names(a, a + span < hi ? a + span : hi, a_zone, a_gw, sizeof a_zone);
        for (int b = lo; b < hi; b += span) {
            if (b == a)
                continue;
            subtree_names(b, b + span < hi ? b + span : hi, b_zone, b_gw, sizeof b_zone);
            snprintf(core, sizeof core, "group%d_%d_core%d_%d", lo, hi, a, b);
            write_route(f, a_zone, b_zone, a_gw, b_gw, core);
        }
        if (!root) {
            snprintf(core, sizeof core, "group%d_%d_up%d", lo, hi, a);
            write_route(f, a_zone, up, a_gw, gw, core);
            snprintf(core, sizeof core, "group%d_%d_down%d", lo, hi, a);
            write_route(f, up, a_zone, gw, a_gw, core);
        }
    }
    fprintf(f, "</zone>\n");
}

/* The cluster's name as XML comment text: no markup, no "--". */
static void comment_safe(const char *in, char *out, size_t size)
{
    size_t n = 0;
    for (; *in != '\0' && n + 1 < size; in++) {
        char ch = *in;
        bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '.' || ch == ':' || ch == '_' ||
                     (ch == '-' && n > 0 && out[n - 1] != '-');
        out[n++] = plain ? ch : '_';
    }
    out[n] = '\0';
}

ps_status ps_sim_platform_write(const ps_cluster *c, FILE *f, ps_error *err)
{
    ps_status st = ps_cluster_validate(c, err);
    if (st != PS_OK)
        return st;
    char name[PS_NAME_MAX];
    comment_safe(c->name, name, sizeof name);
    fprintf(f,
            "<?xml version=\"1.0\"?>\n"
            "<!DOCTYPE platform SYSTEM \"https://simgrid.org/simgrid.dtd\">\n"
            "<!-- pipeshard: cluster %s, %d nodes x %d devices (docs/simulator.md) -->\n"
            "<platform version=\"4.1\">\n",
            name, c->nodes, c->devices_per_node);
    layout l = {.c = c, .f = f};
    int dpn = c->devices_per_node;
    l.nodes_per_pod = PS_SIM_POD_DEVICES / dpn > 1 ? PS_SIM_POD_DEVICES / dpn : 1;
    l.pods = (c->nodes + l.nodes_per_pod - 1) / l.nodes_per_pod;
    write_group(&l, 0, l.pods, true);
    fprintf(f, "</platform>\n");
    if (ferror(f))
        return ps_error_set(err, PS_ERR_IO, "writing the platform of cluster %s failed", c->name);
    return PS_OK;
}
