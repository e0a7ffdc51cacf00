// A team-local array larger than a GPU block's static shared memory (48 KiB).
#[offload::kernel(teams = 4)]
pub fn big(team: usize, thread: usize, y: &mut [f32]) {
    let mut tile: [f32; 1048576] = offload::team_local();
    tile[thread] = 1.0;
    offload::barrier();
    y[team * 4 + thread] = tile[thread];
}

fn main() {}
