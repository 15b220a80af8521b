/* pipeshard models / pipeshard clusters: what is built in, and what a cluster
 * file or preset describes. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/cluster.h"
#include "core/json.h"
#include "planner/models/zoo.h"

static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

int ps_cmd_models(int argc, char **argv)
{
    bool json = false;
    if (wants_help(argc, argv)) {
        printf("usage: pipeshard models [--json]\n\nLists the built-in models with their "
               "parameter counts.\nUse 'pipeshard graph --model NAME' for one model in detail.\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else
            return ps_cli_usage_error("models", "unexpected argument \"%s\"", argv[i]);
    }
    ps_error err = {0};
    ps_status st = PS_OK;
    json_t *list = json ? json_array() : NULL;
    if (json && list == NULL)
        return ps_cli_fail(NULL, PS_ERR_NOMEM);
    if (!json)
        printf("%-14s %-8s %12s  %s\n", "model", "family", "parameters", "description");
    for (int i = 0; i < ps_zoo_count(); i++) {
        const ps_zoo_entry *e = ps_zoo_get(i);
        ps_model_config cfg = e->config;
        cfg.batch = 1; /* parameters do not depend on the batch */
        ps_graph *g = NULL;
        PS_TRY(ps_model_build(&cfg, &g, &err));
        int64_t params = 0;
        for (int t = 0; t < g->n_tensors; t++)
            if (g->tensors[t].kind == PS_TENSOR_PARAM)
                params += ps_tensor_numel(&g->tensors[t]);
        ps_graph_free(g);
        if (json) {
            json_t *o = json_object();
            PS_TRY(ps_json_append(list, o));
            PS_TRY(ps_json_set(o, "name", json_string(e->name)));
            PS_TRY(ps_json_set(o, "family",
                               json_string(ps_model_family_names[e->config.family])));
            PS_TRY(ps_json_set(o, "params", json_integer(params)));
            PS_TRY(ps_json_set(o, "global_batch", json_integer(e->config.global_batch)));
            PS_TRY(ps_json_set(o, "description", json_string(e->description)));
        } else {
            char p[32];
            printf("%-14s %-8s %12s  %s\n", e->name, ps_model_family_names[e->config.family],
                   ps_cli_count((double)params, p, sizeof p), e->description);
        }
    }
    if (json)
        PS_TRY(ps_json_save(list, "-", &err));
out:
    json_decref(list);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}

static void print_cluster(const ps_cluster *c)
{
    char a[64], b[64], d[64], m[64], bw[64];
    int n = ps_cluster_device_count(c);
    printf("cluster       %s: %d node(s) x %d devices = %d devices\n", c->name, c->nodes,
           c->devices_per_node, n);
    for (int k = 0; k < c->n_kinds; k++) {
        int count = 0;
        for (int i = 0; i < n; i++)
            count += c->device_kind[i] == k;
        if (count == 0)
            continue;
        const ps_device_kind *dk = &c->kinds[k];
        char *peak[3] = {a, b, d};
        for (int t = 0; t < PS_FLOAT_DTYPE_COUNT; t++) {
            if (dk->peak_flops[t] > 0)
                ps_cli_si(dk->peak_flops[t], "FLOP/s", peak[t], sizeof a);
            else
                snprintf(peak[t], sizeof a, "no");
        }
        printf("device        %d x %s: %s fp32, %s fp16, %s bf16; %s at %s\n", count, dk->name,
               a, b, d,
               ps_cli_bytes(dk->memory_bytes, m, sizeof m),
               ps_cli_si(dk->memory_bandwidth_bytes_per_s, "B/s", bw, sizeof bw));
    }
    printf("intra-node    %s, %s per device, latency %g us\n",
           ps_intra_topology_names[c->intra.topology],
           ps_cli_si(c->intra.bandwidth_bytes_per_s, "B/s", a, sizeof a),
           c->intra.latency_s * 1e6);
    printf("inter-node    %s, %d NIC(s) x %s per node, latency %g us\n",
           ps_inter_topology_names[c->inter.topology], c->inter.nics_per_node,
           ps_cli_si(c->inter.nic_bandwidth_bytes_per_s, "B/s", a, sizeof a),
           c->inter.latency_s * 1e6);
    if (c->shared_cores_per_node > 0)
        printf("shared cores  %d per node: computes take up to %.3gx as long\n",
               c->shared_cores_per_node, ps_cluster_compute_share(c));
    if (c->scheduler_slice_s > 0)
        printf("scheduler     a %.3g ms slice: devices meeting while others compute wait "
               "for it\n",
               c->scheduler_slice_s * 1e3);
}

int ps_cmd_clusters(int argc, char **argv)
{
    static const struct option opts[] = {{"show", required_argument, NULL, 's'},
                                         {"cluster", required_argument, NULL, 's'},
                                         {"cluster-file", required_argument, NULL, 'f'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *spec = NULL, *file = NULL;
    bool json = false;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'h':
            printf("usage: pipeshard clusters [--show NAME[:N] | --cluster-file C.json] [--json]\n\n"
                   "Without options, lists the cluster presets. With --show or --cluster-file,\n"
                   "describes one cluster; with --json, prints it in the cluster file format\n"
                   "(docs/cluster-format.md), a starting point for a file of your own.\n");
            return 0;
        case 's': spec = optarg; break;
        case 'f': file = optarg; break;
        case 'j': json = true; break;
        default:
            return ps_cli_usage_error("clusters", "unknown or incomplete option \"%s\"",
                                      argv[optind - 1]);
        }
    }
    if (optind < argc)
        return ps_cli_usage_error("clusters", "unexpected argument \"%s\"", argv[optind]);
    if (spec != NULL && file != NULL)
        return ps_cli_usage_error("clusters", "give --show or --cluster-file, not both");
    ps_error err = {0};
    ps_status st = PS_OK;
    bool bad_cluster = false;
    ps_cluster *cl = NULL;
    json_t *j = NULL;
    if (spec == NULL && file == NULL) {
        if (json) {
            j = json_array();
            PS_TRY_ALLOC(j, &err);
        } else {
            printf("%-14s %s\n", "preset", "description (NAME:N for N nodes)");
        }
        for (int i = 0; i < ps_cluster_preset_count(); i++) {
            const ps_cluster_preset_info *p = ps_cluster_preset_get(i);
            if (json) {
                json_t *o = json_object();
                PS_TRY(ps_json_append(j, o));
                PS_TRY(ps_json_set(o, "name", json_string(p->name)));
                PS_TRY(ps_json_set(o, "description", json_string(p->description)));
            } else {
                printf("%-14s %s\n", p->name, p->description);
            }
        }
        if (json)
            PS_TRY(ps_json_save(j, "-", &err));
        goto out;
    }
    if (spec != NULL) {
        if ((st = ps_cluster_from_preset(spec, &cl, &err)) != PS_OK) {
            bad_cluster = true; /* typed on the command line: a usage error */
            goto out;
        }
    } else {
        PS_TRY(ps_cluster_load(file, &cl, &err));
    }
    if (json) {
        PS_TRY(ps_cluster_to_json(cl, &j));
        PS_TRY(ps_json_save(j, "-", &err));
    } else {
        print_cluster(cl);
    }
out:
    json_decref(j);
    ps_cluster_free(cl);
    if (bad_cluster)
        return ps_cli_usage_error("clusters", "--show: %s", err.msg);
    return st == PS_OK ? 0 : ps_cli_fail(&err, st);
}
