# Where the devices of each pipeline stage spend one training step: compute,
# communication (not hidden behind compute) and idle time (pipeline bubbles,
# waiting), averaged over the stage's devices, one stacked bar per run, the
# runs of a stage side by side. Writes out.png and out.svg.
#
# `pipeshard compare A.json B.json --plot DIR` writes DIR/breakdown.dat and runs
# this script; by hand:
#   gnuplot -e "data='DIR/breakdown.dat'; out='DIR/breakdown'; nruns=2; nstages=4" breakdown.gp
#
# Variables (pipeshard sets them all with -e):
#   data, out        the data file (columns: x stage run label compute comm idle)
#                    and the output path without extension
#   title            subtitle: model, cluster, plan
#   unit             unit of the time columns
#   nruns, nstages   runs per stage and stages (x = stage * (nruns + 1) + run)
#   ymax             top of the y axis
#   shares           1: each bar shows its parts as percentages of its own total,
#                    the total written above it (pipeshard sets it when the runs'
#                    totals span more than 20x, e.g. V100 predictions beside a CPU
#                    measurement, where the small bars would not show)

if (!exists("data"))    data = 'breakdown.dat'
if (!exists("out"))     out = 'breakdown'
if (!exists("title"))   title = ''
if (!exists("unit"))    unit = 's'
if (!exists("nruns"))   nruns = 2
if (!exists("nstages")) nstages = 1
if (!exists("shares"))  shares = 0

compute_color = "#4477AA"
comm_color    = "#EE6677"
idle_color    = "#DDDDDD"

w = nstages * (nruns + 1) * 55 + 350
w = w < 900 ? 900 : (w > 2400 ? 2400 : w)

set key outside right top vertical samplen 2 font ",10"
set grid ytics lc rgb "#dddddd"
set style fill solid 0.95 border rgb "#333333"
set boxwidth 0.8
set xrange [-0.8 : nstages * (nruns + 1) - 1.2]
if (shares) {
    set yrange [0:112]
    set ytics 0,20,100
    set ylabel "share of the bar's time per step (%), mean over the stage's devices"
} else {
    if (exists("ymax")) { set yrange [0:ymax] } else { set yrange [0:*] }
    set ylabel sprintf("time per step (%s), mean over the stage's devices", unit)
}
set xtics rotate by 30 right nomirror font ",10" scale 0
set ytics nomirror
# stage names above each group of bars
do for [k=0:nstages-1] {
    set label k+1 sprintf("{/:Bold stage %d}", k) at first k * (nruns + 1) + (nruns - 1) / 2.0, \
        graph 1.03 center
}

do for [fmt in "png svg"] {
    if (fmt eq "png") {
        set terminal pngcairo size w,600 enhanced font "DejaVu Sans,11"
    } else {
        set terminal svg size w,600 enhanced font "DejaVu Sans,11" background rgb "white"
    }
    set output out.".".fmt
    set title "{/:Bold Compute, communication and idle time per stage}\n{/*0.85 ".title."}\n" \
        offset 0,1
    # stacked by drawing the totals first and the lower parts over them
    if (shares) {
        # a bar's parts over its total; an empty bar stays empty
        pct(x, t) = t > 0 ? 100.0 * x / t : 0
        plot data using 1:(pct($5+$6+$7, $5+$6+$7)) with boxes lc rgb idle_color title "idle", \
             '' using 1:(pct($5+$6, $5+$6+$7)) with boxes lc rgb comm_color \
                 title "communication", \
             '' using 1:(pct($5, $5+$6+$7)):xtic(4) with boxes lc rgb compute_color \
                 title "compute", \
             '' using 1:(pct($5+$6+$7, $5+$6+$7)):(sprintf("%.3g %s", $5+$6+$7, unit)) \
                 with labels offset 0,0.7 font ",8" notitle
    } else {
        plot data using 1:($5+$6+$7) with boxes lc rgb idle_color title "idle", \
             '' using 1:($5+$6) with boxes lc rgb comm_color title "communication", \
             '' using 1:5:xtic(4) with boxes lc rgb compute_color title "compute", \
             '' using 1:($5+$6+$7):(sprintf("%.3g", $5+$6+$7)) with labels offset 0,0.7 \
                 font ",9" notitle
    }
    set output
}
