#define _GNU_SOURCE /* dladdr */
#include "exec/hosts.h"

#include <dlfcn.h>

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef PS_HAVE_MPI
#include <mpi.h>
#endif

#ifdef PS_HAVE_MPI
/* A send in flight: MPI reads `owner`'s block until the request completes. */
typedef struct pending_send {
    MPI_Request req;
    void *owner;
} pending_send;
#endif

struct ps_hosts {
    bool mpi;         /* joined an MPI launch (else one process) */
    int rank, count;
    int node_rank;    /* among the processes on this machine */
    int n_devices, per_host;
    long long tag_ub; /* largest MPI tag */
#ifdef PS_HAVE_MPI
    pthread_mutex_t mu; /* pending, stopping */
    pending_send *pending;
    int n_pending, cap_pending;
    /* Drives sends in flight: a large message may need its sender's MPI to
     * make progress, while this process's threads wait elsewhere (a GPU
     * stream, an NCCL kernel, a join) and make no MPI call. */
    pthread_t progress;
    bool progress_started, stopping;
    pthread_cond_t cv; /* a send queued, or stop */
#endif
};

#ifdef PS_HAVE_MPI
static void *progress_main(void *arg);
#endif

bool ps_hosts_launched(void)
{
    /* Open MPI, MPICH / Hydra / Slurm PMI-2, PMIx (Slurm, Open MPI 5) */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]) != NULL)
            return true;
    return false;
}

bool ps_hosts_have_mpi(void)
{
#ifdef PS_HAVE_MPI
    return true;
#else
    return false;
#endif
}

#ifdef PS_HAVE_MPI
static ps_status mpi_fail(const ps_hosts *h, int rc, const char *call, ps_error *err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    return ps_error_set(err, PS_ERR_DEVICE, "rank %d: %s failed: %s", h->rank, call, text);
}
#endif

ps_status ps_hosts_init(ps_hosts **out, ps_error *err)
{
    *out = NULL;
    bool launched = ps_hosts_launched();
#ifndef PS_HAVE_MPI
    if (launched)
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "started by an MPI launcher, but this build has no MPI (install "
                            "an MPI development package and rebuild)");
#endif
    ps_hosts *h = calloc(1, sizeof *h);
    if (h == NULL)
        return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
    h->count = 1;
#ifdef PS_HAVE_MPI
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (launched) {
        /* libsimgrid defines MPI_* too (SMPI); a program that needs it before
         * libmpi would call SimGrid's (the build links libmpi first) */
        Dl_info info;
        if (dladdr((void *)MPI_Init_thread, &info) != 0 && info.dli_fname != NULL &&
            strstr(info.dli_fname, "simgrid") != NULL) {
            free(h);
            return ps_error_set(err, PS_ERR_INTERNAL,
                                "MPI_Init_thread resolves to %s, not the MPI library: link "
                                "libmpi before libsimgrid",
                                info.dli_fname);
        }
        int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            ps_status st = mpi_fail(h, rc, "MPI_Init_thread", err);
            free(h);
            return st;
        }
        h->mpi = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &h->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &h->count);
        if (provided < MPI_THREAD_MULTIPLE) {
            ps_error_set(err, PS_ERR_UNSUPPORTED,
                         "rank %d: this MPI offers thread level %d, not MPI_THREAD_MULTIPLE "
                         "(every device thread talks to other hosts)",
                         h->rank, provided);
            ps_hosts_finalize(h);
            return PS_ERR_UNSUPPORTED;
        }
        /* the processes sharing this machine (and its GPUs) */
        MPI_Comm node;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, h->rank, MPI_INFO_NULL,
                                &node) == MPI_SUCCESS) {
            MPI_Comm_rank(node, &h->node_rank);
            MPI_Comm_free(&node);
        }
        int *ub = NULL, flag = 0;
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
        h->tag_ub = flag && ub != NULL ? *ub : 32767;
        if (h->count > 1)
            h->progress_started = pthread_create(&h->progress, NULL, progress_main, h) == 0;
    }
#endif
    *out = h;
    return PS_OK;
}

void ps_hosts_finalize(ps_hosts *h)
{
    if (h == NULL)
        return;
#ifdef PS_HAVE_MPI
    if (h->progress_started) {
        pthread_mutex_lock(&h->mu);
        h->stopping = true;
        pthread_cond_signal(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->progress, NULL);
    }
    for (int i = 0; i < h->n_pending; i++) {
        MPI_Wait(&h->pending[i].req, MPI_STATUS_IGNORE);
        free(h->pending[i].owner);
    }
    free(h->pending);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    if (h->mpi)
        MPI_Finalize();
#endif
    free(h);
}

void ps_hosts_abort(ps_hosts *h, int code)
{
    fflush(stdout);
    fflush(stderr);
#ifdef PS_HAVE_MPI
    if (h != NULL && h->mpi)
        MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)h;
    exit(code);
}

int ps_hosts_rank(const ps_hosts *h) { return h != NULL ? h->rank : 0; }
int ps_hosts_node_rank(const ps_hosts *h) { return h != NULL ? h->node_rank : 0; }
int ps_hosts_per_host(const ps_hosts *h) { return h != NULL ? h->per_host : 0; }
int ps_hosts_count(const ps_hosts *h) { return h != NULL ? h->count : 1; }

ps_status ps_hosts_assign(ps_hosts *h, int n_devices, int per_host, ps_error *err)
{
    if (n_devices < 1 || per_host < 1)
        return ps_error_set(err, PS_ERR_INVALID, "%d devices, %d per host", n_devices, per_host);
    int need = (n_devices + per_host - 1) / per_host;
    if (h->count > 1 && need != h->count)
        return ps_error_set(err, PS_ERR_INVALID,
                            "the plan's %d devices span %d host%s (%d devices per node), but "
                            "the launch started %d processes: start one per host (mpirun -np "
                            "%d)",
                            n_devices, need, need == 1 ? "" : "s", per_host, h->count, need);
    long long tags = (long long)n_devices * n_devices * PS_HOSTS_CHANNELS;
    if (h->count > 1 && tags - 1 > h->tag_ub)
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "%d devices need %lld MPI tags; this MPI offers %lld", n_devices,
                            tags, h->tag_ub + 1);
    h->n_devices = n_devices;
    h->per_host = h->count > 1 ? per_host : n_devices;
    return PS_OK;
}

int ps_hosts_owner(const ps_hosts *h, int device)
{
    if (h == NULL || h->count == 1 || h->per_host < 1)
        return 0;
    return device / h->per_host;
}

bool ps_hosts_is_local(const ps_hosts *h, int device)
{
    return ps_hosts_owner(h, device) == ps_hosts_rank(h);
}

static ps_status single_process(int device, ps_error *err)
{
    return ps_error_set(err, PS_ERR_INTERNAL,
                        "device %d: a message to another host in a single-process run", device);
}

#ifdef PS_HAVE_MPI
static int tag_of(const ps_hosts *h, int src, int dst, int channel)
{
    return (int)(((long long)src * h->n_devices + dst) * PS_HOSTS_CHANNELS + channel);
}

static void reap_sends(ps_hosts *h);

/* The progress thread: tests the sends in flight every 50 us while there
 * are any, sleeps otherwise. */
static void *progress_main(void *arg)
{
    ps_hosts *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        if (h->n_pending == 0) {
            pthread_cond_wait(&h->cv, &h->mu);
            continue;
        }
        reap_sends(h);
        pthread_mutex_unlock(&h->mu);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Frees the buffers of completed sends (under h->mu). */
static void reap_sends(ps_hosts *h)
{
    int kept = 0;
    for (int i = 0; i < h->n_pending; i++) {
        int done = 0;
        MPI_Test(&h->pending[i].req, &done, MPI_STATUS_IGNORE);
        if (done)
            free(h->pending[i].owner);
        else
            h->pending[kept++] = h->pending[i];
    }
    h->n_pending = kept;
}
#endif

ps_status ps_hosts_send(ps_hosts *h, int src, int dst, int channel, const void *data,
                        size_t bytes, void *owner, ps_error *err)
{
#ifdef PS_HAVE_MPI
    if (h->mpi && h->count > 1) {
        if (bytes > (size_t)INT_MAX) {
            free(owner);
            return ps_error_set(err, PS_ERR_UNSUPPORTED,
                                "device %d: a message of %zu bytes to device %d is larger than "
                                "one MPI message (2 GiB)",
                                src, bytes, dst);
        }
        pthread_mutex_lock(&h->mu);
        reap_sends(h);
        if (h->n_pending == h->cap_pending) {
            int cap = h->cap_pending ? 2 * h->cap_pending : 64;
            pending_send *p = realloc(h->pending, (size_t)cap * sizeof *p);
            if (p == NULL) {
                pthread_mutex_unlock(&h->mu);
                free(owner);
                return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
            }
            h->pending = p;
            h->cap_pending = cap;
        }
        pending_send *ps = &h->pending[h->n_pending];
        int rc = MPI_Isend(data, (int)bytes, MPI_BYTE, ps_hosts_owner(h, dst),
                           tag_of(h, src, dst, channel), MPI_COMM_WORLD, &ps->req);
        if (rc == MPI_SUCCESS) {
            ps->owner = owner;
            h->n_pending++;
            pthread_cond_signal(&h->cv);
        }
        pthread_mutex_unlock(&h->mu);
        if (rc != MPI_SUCCESS) {
            free(owner);
            return mpi_fail(h, rc, "MPI_Isend", err);
        }
        return PS_OK;
    }
#endif
    (void)dst, (void)channel, (void)data, (void)bytes, (void)h;
    free(owner);
    return single_process(src, err);
}

ps_status ps_hosts_recv(ps_hosts *h, int src, int dst, int channel, bool (*stop)(void *),
                        void *arg, void **data, size_t *bytes, ps_error *err)
{
    *data = NULL;
    *bytes = 0;
#ifdef PS_HAVE_MPI
    if (h->mpi && h->count > 1) {
        /* a matched probe, so that concurrent receivers never take each
         * other's message; polled, so that an abort is noticed */
        int flag = 0;
        MPI_Message msg;
        MPI_Status status;
        for (long spins = 0;; spins++) {
            int rc = MPI_Improbe(ps_hosts_owner(h, src), tag_of(h, src, dst, channel),
                                 MPI_COMM_WORLD, &flag, &msg, &status);
            if (rc != MPI_SUCCESS)
                return mpi_fail(h, rc, "MPI_Improbe", err);
            if (flag)
                break;
            if (stop != NULL && stop(arg))
                return ps_error_set(err, PS_ERR_DEVICE,
                                    "device %d: stopped because another device failed", dst);
            if (spins > 64) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        void *buf = malloc(count > 0 ? (size_t)count : 1);
        if (buf == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "device %d: out of host memory", dst);
        int rc = MPI_Mrecv(buf, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            free(buf);
            return mpi_fail(h, rc, "MPI_Mrecv", err);
        }
        *data = buf;
        *bytes = (size_t)count;
        return PS_OK;
    }
#endif
    (void)src, (void)channel, (void)stop, (void)arg, (void)h;
    return single_process(dst, err);
}

ps_status ps_hosts_barrier(ps_hosts *h, ps_error *err)
{
#ifdef PS_HAVE_MPI
    if (h != NULL && h->mpi && h->count > 1) {
        int rc = MPI_Barrier(MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(h, rc, "MPI_Barrier", err);
    }
#endif
    (void)h, (void)err;
    return PS_OK;
}

ps_status ps_hosts_sum(ps_hosts *h, double *values, int n, ps_error *err)
{
#ifdef PS_HAVE_MPI
    if (h != NULL && h->mpi && h->count > 1) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(h, rc, "MPI_Allreduce", err);
    }
#endif
    (void)h, (void)values, (void)n, (void)err;
    return PS_OK;
}

ps_status ps_hosts_gather(ps_hosts *h, const void *mine, size_t bytes, void **all,
                          size_t *sizes, ps_error *err)
{
    *all = NULL;
    int count = ps_hosts_count(h), rank = ps_hosts_rank(h);
    if (bytes > (size_t)INT_MAX)
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "rank %d: %zu bytes to gather exceed one MPI message (2 GiB)", rank,
                            bytes);
    if (count == 1) {
        void *copy = malloc(bytes > 0 ? bytes : 1);
        if (copy == NULL)
            return ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        memcpy(copy, mine, bytes);
        *all = copy;
        sizes[0] = bytes;
        return PS_OK;
    }
#ifdef PS_HAVE_MPI
    int n = (int)bytes, *counts = NULL, *displs = NULL;
    void *buf = NULL;
    ps_status st = PS_OK;
    if (rank == 0) {
        counts = calloc((size_t)count, sizeof *counts);
        displs = calloc((size_t)count, sizeof *displs);
        if (counts == NULL || displs == NULL) { /* the other ranks would wait forever */
            fprintf(stderr, "pipeshard: rank 0: out of memory gathering results\n");
            ps_hosts_abort(h, 1);
        }
    }
    int rc = MPI_Gather(&n, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(counts);
        free(displs);
        return mpi_fail(h, rc, "MPI_Gather", err);
    }
    long long total = 0;
    if (rank == 0 && st == PS_OK) {
        for (int r = 0; r < count; r++) {
            displs[r] = (int)total;
            total += counts[r];
            sizes[r] = (size_t)counts[r];
        }
        if (total > INT_MAX)
            st = ps_error_set(err, PS_ERR_UNSUPPORTED,
                              "%lld bytes to gather exceed one MPI message (2 GiB)", total);
        else if ((buf = malloc(total > 0 ? (size_t)total : 1)) == NULL)
            st = ps_error_set(err, PS_ERR_NOMEM, "out of memory");
        if (st != PS_OK) /* receive nothing; the senders' data is dropped */
            for (int r = 0; r < count; r++)
                counts[r] = displs[r] = 0;
    }
    rc = MPI_Gatherv(mine, n, MPI_BYTE, buf, counts, displs, MPI_BYTE, 0,
                     MPI_COMM_WORLD);
    free(counts);
    free(displs);
    if (rc != MPI_SUCCESS && st == PS_OK)
        st = mpi_fail(h, rc, "MPI_Gatherv", err);
    if (st != PS_OK) {
        free(buf);
        return st;
    }
    *all = buf;
    return PS_OK;
#else
    (void)mine, (void)sizes;
    return single_process(-1, err);
#endif
}

ps_status ps_hosts_allgather(ps_hosts *h, const void *mine, size_t bytes, void **all, size_t *sizes,
                             ps_error *err)
{
    *all = NULL;
    int count = ps_hosts_count(h), rank = ps_hosts_rank(h);
    if (bytes > (size_t)INT_MAX)
        return ps_error_set(err, PS_ERR_UNSUPPORTED,
                            "rank %d: %zu bytes to gather exceed one MPI message (2 GiB)", rank,
                            bytes);
    if (count == 1)
        return ps_hosts_gather(h, mine, bytes, all, sizes, err);
#ifdef PS_HAVE_MPI
    int n = (int)bytes, *counts = calloc((size_t)count, sizeof *counts),
        *displs = calloc((size_t)count, sizeof *displs);
    if (counts == NULL || displs == NULL) { /* the other ranks would wait forever */
        fprintf(stderr, "pipeshard: rank %d: out of memory gathering step times\n", rank);
        ps_hosts_abort(h, 1);
    }
    int rc = MPI_Allgather(&n, 1, MPI_INT, counts, 1, MPI_INT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        free(counts);
        free(displs);
        return mpi_fail(h, rc, "MPI_Allgather", err);
    }
    long long total = 0;
    for (int r = 0; r < count; r++) {
        displs[r] = (int)total;
        total += counts[r];
        sizes[r] = (size_t)counts[r];
    }
    void *buf = total <= INT_MAX ? malloc(total > 0 ? (size_t)total : 1) : NULL;
    if (buf == NULL) { /* every rank computed the same total: all stop here */
        free(counts);
        free(displs);
        if (total > INT_MAX)
            return ps_error_set(err, PS_ERR_UNSUPPORTED,
                                "%lld bytes to gather exceed one MPI message (2 GiB)", total);
        fprintf(stderr, "pipeshard: rank %d: out of memory gathering step times\n", rank);
        ps_hosts_abort(h, 1);
    }
    rc = MPI_Allgatherv(mine, n, MPI_BYTE, buf, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
    free(counts);
    free(displs);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mpi_fail(h, rc, "MPI_Allgatherv", err);
    }
    *all = buf;
    return PS_OK;
#else
    (void)mine, (void)sizes;
    return single_process(-1, err);
#endif
}

ps_status ps_hosts_bcast(ps_hosts *h, void *buf, size_t bytes, int root, ps_error *err)
{
#ifdef PS_HAVE_MPI
    if (h != NULL && h->mpi && h->count > 1) {
        if (bytes > (size_t)INT_MAX)
            return ps_error_set(err, PS_ERR_UNSUPPORTED,
                                "%zu bytes to broadcast exceed one MPI message", bytes);
        int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return mpi_fail(h, rc, "MPI_Bcast", err);
    }
#endif
    (void)h, (void)buf, (void)bytes, (void)root, (void)err;
    return PS_OK;
}
