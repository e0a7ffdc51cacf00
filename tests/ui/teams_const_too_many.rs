// A team size from module constants past 1024 threads: rustc's check beside the kernel.
const SIDE: usize = 64;

#[offload::kernel(teams = SIDE * SIDE)]
fn k(team: usize, thread: usize, y: &mut [f32]) {
    y[team * SIDE * SIDE + thread] = 1.0;
}

fn main() {}
