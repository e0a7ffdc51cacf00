// A team-local array's length from a kernel argument: refused (it is static shared memory).
#[offload::kernel(teams = 64)]
fn k(team: usize, thread: usize, n: usize, y: &mut [f32]) {
    let mut tile: [f32; n * 2] = offload::team_local();
    tile[thread] = 1.0;
    y[team * 64 + thread] = tile[thread];
}

fn main() {}
