// A team-local array sized by module constants past 48 KiB: rustc's check beside the kernel.
const SIDE: usize = 128;

#[offload::kernel(teams = 64)]
fn k(team: usize, thread: usize, y: &mut [f32]) {
    let mut tile: [f32; SIDE * SIDE] = offload::team_local();
    tile[thread] = 1.0;
    y[team * 64 + thread] = tile[thread];
}

fn main() {}
