// Two team-local arrays, each under 48 KiB, over it together: a GPU block's static shared
// memory holds them all.
#[offload::kernel(teams = 64)]
fn k(team: usize, thread: usize, y: &mut [f32]) {
    let mut a: [f32; 8192] = offload::team_local();
    let mut b: [f32; 8192] = offload::team_local();
    a[thread] = 1.0;
    b[thread] = 2.0;
    y[team * 64 + thread] = a[thread] + b[thread];
}

fn main() {}
