# Predicted against measured, per pipeline stage (mesh slice): every run's
# time per micro-batch (forward + backward, left) and peak memory (right)
# against the reference run's. A point on the diagonal is exact; the shaded
# bands are the +-10% and +-25% errors. Writes out.png and out.svg.
#
# `pipeshard compare A.json B.json --plot DIR` writes DIR/scatter.dat and runs
# this script; to restyle, edit it and run the same command again, or by hand
# with the command on the data file's last line (every variable as pipeshard
# set it); with fewer, the others take the defaults below.
#
# Variables (pipeshard sets them all with -e):
#   data, out       the data file (its header lists the columns) and the output
#                   path without extension
#   title           subtitle: model, cluster, plan
#   ref             the reference run's label, e.g. "C exec-cuda"
#   nruns           number of runs in data (one block each, after a title line)
#   tunit, munit    units of the time and memory columns
#   tlo, thi, tlog  time axis range, and 1 for logarithmic axes
#   mlo, mhi, mlog  memory axis range, likewise

if (!exists("data"))  data = 'scatter.dat'
if (!exists("out"))   out = 'scatter'
if (!exists("title")) title = ''
if (!exists("ref"))   ref = 'reference'
if (!exists("nruns")) nruns = 1
if (!exists("tunit")) tunit = 'ms'
if (!exists("munit")) munit = 'GiB'
if (!exists("tlog"))  tlog = 0
if (!exists("mlog"))  mlog = 0
# without ranges (a hand-run script): each axis spans its columns' values, as
# pipeshard's would (the bands and the diagonal are drawn over the range)
if (!exists("tlo") || !exists("thi")) {
    stats data using 2 nooutput prefix "R"
    stats data using 3 nooutput prefix "V"
    tmin = R_min < V_min ? R_min : V_min
    tmax = R_max > V_max ? R_max : V_max
    tlog = tmin > 0 && tmax / tmin > 20 ? 1 : 0
    tlo = tlog ? tmin / 1.5 : (tmin > 0 ? tmin * 0.75 : 0)
    thi = tmax > 0 ? (tlog ? tmax * 1.5 : tmax * 1.15) : 1
}
if (!exists("mlo") || !exists("mhi")) {
    stats data using 5 nooutput prefix "R"
    stats data using 6 nooutput prefix "V"
    mmin = R_min < V_min ? R_min : V_min
    mmax = R_max > V_max ? R_max : V_max
    mlog = mmin > 0 && mmax / mmin > 20 ? 1 : 0
    mlo = mlog ? mmin / 1.5 : (mmin > 0 ? mmin * 0.75 : 0)
    mhi = mmax > 0 ? (mlog ? mmax * 1.5 : mmax * 1.15) : 1
}

# "measured" only when the reference is a measurement (exec-cpu, exec-cuda)
refkind = strstrt(ref, "exec") > 0 ? "measured" : "reference"

# one color and point shape per run (colorblind-safe, Paul Tol's palette)
array runcolor[6] = ["#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377"]

set key top left box opaque samplen 2 spacing 1.2 font ",10"
set grid lc rgb "#dddddd"
set style fill solid 1.0 noborder
set samples 200
set key autotitle columnheader   # each block's first line is its run's name

do for [fmt in "png svg"] {
    if (fmt eq "png") {
        set terminal pngcairo size 1400,640 enhanced font "DejaVu Sans,11"
    } else {
        set terminal svg size 1400,640 enhanced font "DejaVu Sans,11" background rgb "white"
    }
    set output out.".".fmt
    set multiplot layout 1,2 title "{/:Bold Predicted vs ".refkind." per pipeline stage}\n{/*0.85 ".title. \
        "; the numbers beside the points are stage indices}"
    do for [panel=1:2] {
        lo  = panel == 1 ? tlo : mlo
        hi  = panel == 1 ? thi : mhi
        lg  = panel == 1 ? tlog : mlog
        u   = panel == 1 ? tunit : munit
        xc  = panel == 1 ? 2 : 5      # the reference's column
        yc  = panel == 1 ? 3 : 6      # the run's column
        if (panel == 1) {
            set title "Time per micro-batch (forward + backward)"
        } else {
            set title "Peak memory per device (max over the stage)"
        }
        if (lg) { set logscale xy; set format xy "%g" } else { unset logscale; set format xy "% h" }
        if (lo == lo && hi == hi) { set xrange [lo:hi]; set yrange [lo:hi] } else { set autoscale xy }
        set size ratio -1
        set xlabel sprintf("%s: %s (%s)", refkind, ref, u)
        set ylabel sprintf("%s (%s)", refkind eq "measured" ? "predicted" : "run", u)
        # the stage labels of runs 0 to 3 sit at four corners of their points, so
        # that runs that agree (the planner and the simulator) do not cover each other
        plot '+' using 1:($1*0.75):($1*1.25) with filledcurves lc rgb "#e4e4e4" title "±25%", \
             '+' using 1:($1*0.9):($1*1.1) with filledcurves lc rgb "#c4c4c4" title "±10%", \
             '+' using 1:1 with lines lc rgb "black" dt 2 lw 1.5 title "y = x", \
             for [i=0:nruns-1] data index i using xc:yc with points pt (5 + 2*(i%4)) ps 1.8 \
                 lc rgb runcolor[i%6+1] title columnheader(1), \
             for [i=0:nruns-1] data index i using xc:yc:(sprintf("%d", $1)) with labels \
                 offset char (i%4 < 2 ? 1.3 : -1.3), char (i%2 == 0 ? 0.7 : -0.8) \
                 font ",9" tc rgb runcolor[i%6+1] notitle
    }
    unset multiplot
    set output
}
